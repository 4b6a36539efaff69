// hw.h: hardware profiles. Every number in a built-in profile has its public source in
// docs/hardware.md. A profile can also be read from a JSON file with the same field names.
#ifndef BYTESCALE_HW_H
#define BYTESCALE_HW_H

#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    char name[32];
    int gpus_per_node;
    double peak_flops;    // dense 16-bit (bf16) tensor FLOP/s per device
    double efficiency;    // achievable fraction of peak on large matmuls / attention (MFU-like)
    double mem_bytes;     // device memory (HBM) per device
    double intra_bw;      // bytes/s per device per direction inside a node (NVLink)
    double inter_bw;      // bytes/s per device per direction across nodes (RDMA NIC)
    double intra_lat;     // seconds per message inside a node
    double inter_lat;     // seconds per message across nodes
    double host_bw;       // bytes/s per device per direction, device <-> host memory (offload tier)
    int elem_bytes;       // bytes per activation / K/V element in training (2 for bf16)
    // added after the first draft; 0 in a hand-built profile means "not given" (see each field)
    double attn_efficiency;  // achievable fraction of peak in attention kernels (0: use efficiency)
    double mem_bw;           // bytes/s of device memory (HBM), for the optimizer step (0: not modelled)
    // added with the ring-step floor (docs/cost-model.md section 4): seconds one attention kernel call
    // costs per layer, forward + backward, whatever its size (launches, fixed work); a ring of D ranks
    // makes D such calls per layer, a pack one (0: not modelled)
    double attn_step;
} HardwareProfile;

int hw_count(void);
const HardwareProfile *hw_at(int i);
const HardwareProfile *hw_find(const char *name);         // NULL + error listing the names
// JSON fields: the struct's names; attn_efficiency and mem_bw may be left out (0 as above).
int hw_load_file(const char *path, HardwareProfile *out);  // -1 + error naming the file and field
int hw_save_file(const HardwareProfile *h, const char *path);  // written atomically
// What every command's --hardware takes: a profile JSON file when the text has a '/' or ends in
// .json (hw_load_file), else a built-in profile's name (hw_find). One rule, so `plan` and `simulate`
// read the same value the same way. -1 + error naming the file or listing the profiles.
int hw_resolve(const char *name_or_file, HardwareProfile *out);
int hw_check(const HardwareProfile *h);                    // -1 + error naming the profile and field

BS_API_END

#endif
