// cli.h: the subcommands of `bytescale` (one file each) and the flag helpers they share.
#ifndef BYTESCALE_CLI_H
#define BYTESCALE_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "bytescale/comm.h"
#include "bytescale/loader.h"

struct option;  // getopt.h

int cmd_plan(int argc, char **argv);
int cmd_simulate(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_serve(int argc, char **argv);
// A data server of this MPI job (roles made by comm_mpi_split_roles on `world`): serve until the
// training ranks are done, then finalize MPI and return 0; on an error, say it and abort the job.
// serve_defaults: the text options' defaults.
int cmd_serve_role(Comm *world, const LoaderServeConfig *cfg, const CommRoles *roles);
void serve_defaults(LoaderServeConfig *cfg, const char *dir);

// Integers with an optional binary suffix: 8K = 8192, 2M = 2097152, 1G. Names the flag on error.
int arg_int64(const char *flag, const char *text, int64_t *out);
int arg_int(const char *flag, const char *text, int *out);
int arg_double(const char *flag, const char *text, double *out);

// Read argv's flags (getopt_long, every flag but -h/--help taking a value) into given[opt - first]:
// the value given, NULL where absent. 1: help was asked for; 0: read; -1 + error ("--x needs a
// value", "unknown flag '--y'", "unexpected argument 'z'", "--x is given twice": a flag given twice,
// by its name or an abbreviation of it, is refused rather than the later value winning).
int cli_read_flags(int argc, char **argv, const struct option *options, int first, const char **given, int n_given);

// Every command's flags, before the command reads them: -1 + error ("--x is given twice: ...") when a
// flag "--x" or "--x=v" appears twice in argv (up to a "--"), unless its name is in repeatable (a
// NULL-terminated list such as {"--input", NULL}, or NULL) or it is --help. Flags are not
// last-wins: a repeated one is a mistake in a script or a command line, never an override.
int cli_repeated_flag(int argc, char **argv, const char *const *repeatable);

// Flags that `plan` and `simulate` once spelled differently (one vocabulary now: --dist SPEC, --lengths
// FILE, --ranks N, --gpus N, --hardware NAME|FILE, --cost FILE). For an unknown flag arg ("--x" or
// "--x=value"): the message saying what replaced it, or NULL when it never was one of ours.
const char *cli_retired_flag(const char *arg);

// Errors, one form for every command, on one process and on every rank of an MPI job alike (README.md
// "Exit codes and errors"): "bytescale <command>: error: <message>" on stderr, where under MPI the
// message starts with "rank R of N: ". Exit 2 for a usage error, one the command line alone shows (an
// unknown, malformed, repeated or out-of-range flag, a value none of the choices, flags that conflict,
// a layout the job's processes do not make: nothing was done, the help line follows); 1 for a failure
// (what the file system, the data, the PATH, memory, MPI or the run refused); MPI_Abort gets the same
// code, which mpirun returns.
enum { CLI_EXIT_FAILURE = 1, CLI_EXIT_USAGE = 2 };
// Say a usage error and return CLI_EXIT_USAGE (`return cli_usage_error(...)` from a command).
int cli_usage_error(const char *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Say a failure and exit(CLI_EXIT_FAILURE). command NULL: "bytescale: error: ..." (no command yet).
_Noreturn void cli_die(const char *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// A rank that cannot go on says who it is and why, then ends the whole job (under MPI the other ranks
// would otherwise wait for it forever): a failure (exit 1) / a usage error found once the job's size
// is known (exit 2, with the help line), such as a layout the processes do not divide into.
_Noreturn void cli_rank_die(Comm *comm, const char *command, const char *msg);
_Noreturn void cli_rank_usage(Comm *comm, const char *command, const char *msg);
// "--tp 8", "--pp 2" or "--tp 8 x --pp 2 = 16" into buf: a refusal names only the flags in play.
const char *cli_layout_flags(char *buf, size_t cap, int tp, int pp);

// file_find_source (fileio.h) is how the commands find files of the source tree.

#endif
