// bytescale.h: the whole public API in one include: what `make install` installs and the shared
// library exports (docs/architecture.md, "The installed library").
//
//   errors        error.h     bs_errmsg(): every failure's message
//   batches       batch.h     global batches, lengths files, length distributions (rng.h)
//   cost model    cost.h      T(s), Act(s), item times, Eq. 3; model.h the model catalogue, hw.h the
//                             hardware profiles
//   plans         plan.h      the plan, its validator, statistics, plan files; policy.h the planners
//   simulator     sim.h       one step on a modelled cluster (cluster.h); scenario.h the paper's
//                             presets and the policy comparison
//   flat API      api.h       the same behind opaque handles and plain arrays (the Python package)
//
// Build with `pkg-config --cflags --libs bytescale`, or find_package(bytescale) and link
// bytescale::bytescale (README.md, "Using the library").
#ifndef BYTESCALE_BYTESCALE_H
#define BYTESCALE_BYTESCALE_H

#include "bytescale/api.h"
#include "bytescale/batch.h"
#include "bytescale/cluster.h"
#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/export.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/rng.h"
#include "bytescale/scenario.h"
#include "bytescale/sim.h"

#endif
