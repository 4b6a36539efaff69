// profile_internal.h: what the profile's files share and nobody else needs. profile.c runs and
// reports the measurements; each measurement's file (profile_layer.c, profile_head.c, profile_act.c,
// profile_link.c, profile_ring.c, profile_3d.c, profile_tier.c) uses only profile_fit.c and this
// header, never profile.c or another measurement's file (the head excepted: it is fitted from the
// layer's timings), so no two of them depend on each other.
#ifndef BYTESCALE_PROFILE_INTERNAL_H
#define BYTESCALE_PROFILE_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include <cJSON.h>

#include "bytescale/comm.h"
#include "bytescale/profile.h"
#include "bytescale/progress.h"

// The progress line's position. Units are estimated milliseconds (from the `cpu` profile's
// coefficients), so the ETA holds although the largest sizes take most of the time.
typedef struct {
    Progress *pr;  // NULL: no line
    int64_t done;
} ProfileTick;

// One step of the progress line (at least one unit, so every step shows). Here, not in a .c file,
// so that a measurement's file needs nothing of profile.c.
static inline void profile_tick(ProfileTick *t, int64_t units, const char *note) {
    t->done += units > 0 ? units : 1;
    if (t->pr) progress_update(t->pr, t->done, note);
}

// ---- profile_fit.c: the statistics and fits every measurement shares ----

// The median of v[0..n), v left as it was (NAN when n < 1).
double profile_median(const double *v, int n);
// (max - min) / median of v[0..n): how far a point's samples scatter.
double profile_spread(const double *v, int n, double median);
// All ranks' n values (the same n on each), in rank order, into a fresh buffer (NULL + error).
double *profile_gather(Comm *comm, const double *mine, int n);
// A JSON array of v[0..n).
cJSON *profile_number_array(const double *v, int n);

// ---- one file per measurement: its progress units, the measurement, its table for profile_print
// and its member for the file (profile_json) ----

// The layer's compute (profile_layer.c): progress units of one (length, repetition); the table and
// the member "compute". (profile_measure_compute and profile_fit_compute are in profile.h.)
int64_t profile_compute_units(const Profile *p, int64_t s);
void profile_layer_print(FILE *f, const Profile *p);
cJSON *profile_layer_json(const Profile *p);

// The head (profile_head.c): fitted from the layer's timings (profile_fit_compute calls it), its
// table and the member "head".
int profile_fit_head(Profile *p);
void profile_head_print(FILE *f, const Profile *p);
cJSON *profile_head_json(const Profile *p);

// Activations (profile_act.c; profile_measure_act is in profile.h): the table and "activations".
void profile_act_print(FILE *f, const Profile *p);
cJSON *profile_act_json(const Profile *p);

// The link between ranks 0 and 1 (profile_link.c): the measurement (collective; nothing with one
// process), the table and "links".
int profile_measure_link(Profile *p, Comm *comm, ProfileTick *t);
void profile_link_print(FILE *f, const Profile *p);
cJSON *profile_link_json(const Profile *p);

// The offload tier (profile_tier.c): progress units of the whole measurement, the measurement
// (collective: every rank's copies at once), the table and "offload".
int64_t profile_tier_units(const ProfileConfig *c);
int profile_measure_tier(Profile *p, Comm *comm, ProfileTick *t);
void profile_tier_print(FILE *f, const Profile *p);
cJSON *profile_tier_json(const Profile *p);

// The ring-step part (profile_ring.c): the progress units of profile_measure_ring at p->cfg, its
// table for profile_print, and its member "ring_step" for the file.
int64_t profile_ring_units(const Profile *p);
void profile_ring_print(FILE *f, const Profile *p);
cJSON *profile_ring_json(const Profile *p);

// The 3D part (profile_3d.c): its progress units, the measurement (collective; nothing with one
// process), its table for profile_print and its member "3d" for the file.
int64_t profile_3d_units(const Profile *p, const Comm *comm);
int profile_measure_3d(Profile *p, Comm *comm, ProfileTick *t);
void profile_3d_print(FILE *f, const Profile *p);
cJSON *profile_3d_json(const Profile *p);

#endif
