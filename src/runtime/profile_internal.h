// profile_internal.h: what the profile's files share and nobody else needs (profile.c, profile_ring.c).
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

void profile_tick(ProfileTick *t, int64_t units, const char *note);

// The median of v[0..n), v left as it was (NAN when n < 1).
double profile_median(const double *v, int n);
// (max - min) / median of v[0..n): how far a point's samples scatter.
double profile_spread(const double *v, int n, double median);
// All ranks' n values (the same n on each), in rank order, into a fresh buffer (NULL + error).
double *profile_gather(Comm *comm, const double *mine, int n);
// A JSON array of v[0..n).
cJSON *profile_number_array(const double *v, int n);

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
