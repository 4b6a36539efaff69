// cli.h: the subcommands of `bytescale` (one file each) and the flag helpers they share.
#ifndef BYTESCALE_CLI_H
#define BYTESCALE_CLI_H

#include <stddef.h>
#include <stdint.h>

int cmd_plan(int argc, char **argv);
int cmd_simulate(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_profile(int argc, char **argv);

// Integers with an optional binary suffix: 8K = 8192, 2M = 2097152, 1G. Names the flag on error.
int arg_int64(const char *flag, const char *text, int64_t *out);
int arg_int(const char *flag, const char *text, int *out);
int arg_double(const char *flag, const char *text, double *out);

// Flags that `plan` and `simulate` once spelled differently (one vocabulary now: --dist SPEC, --lengths
// FILE, --ranks N, --gpus N, --hardware NAME|FILE, --cost FILE). For an unknown flag arg ("--x" or
// "--x=value"): the message saying what replaced it, or NULL when it never was one of ours.
const char *cli_retired_flag(const char *arg);

// Find a file of the source tree (tokenizer data, scripts) given its path relative to the tree:
// in the current directory, then under $BS_SOURCE_DIR, then two levels above the running binary
// (build/bytescale -> the tree). -1 + error listing where it looked.
int cli_find_source_file(const char *rel, char *out, size_t cap);

#endif
