// sim_fixtures.h: the hand-made hardware the simulator tests compute their timelines with. Round
// numbers (1e3 FLOP/s, 200 / 100 bytes/s links) keep every expected time derivable by hand.
#ifndef BYTESCALE_TEST_SIM_FIXTURES_H
#define BYTESCALE_TEST_SIM_FIXTURES_H

#include <stdio.h>
#include <string.h>

#include "bytescale/hw.h"

static inline HardwareProfile hand_hw(int gpus_per_node) {
    HardwareProfile hw;
    memset(&hw, 0, sizeof hw);
    snprintf(hw.name, sizeof hw.name, "hand");
    hw.gpus_per_node = gpus_per_node;
    hw.peak_flops = 1e3;
    hw.efficiency = 1;
    hw.mem_bytes = 1e9;
    hw.intra_bw = 200;
    hw.intra_lat = 0.001;
    hw.inter_bw = 100;
    hw.inter_lat = 0.01;
    hw.host_bw = 100;
    hw.elem_bytes = 2;
    return hw;
}

#endif
