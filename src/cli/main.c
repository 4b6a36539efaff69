// main.c: `bytescale <command> [flags]`. One file per command in src/cli.
#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"
#include "cli/cli.h"
#include "nn/blas_core.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    int blas;  // runs the engine's matmuls: OpenBLAS's kernels are checked first (nn/blas_core.h)
} Command;

static const Command commands[] = {
    {"plan", cmd_plan, "plan a global batch with a policy (HDP's naive, balance, elastic; static and the peers')", 0},
    {"simulate", cmd_simulate, "simulate a training step of each policy on a modelled GPU cluster", 0},
    {"prepare", cmd_prepare, "turn text files into token shards plus a document index", 0},
    {"train", cmd_train, "train a model on a prepared dataset (one process; checkpoints, resume, metrics)", 1},
    {"profile", cmd_profile, "measure this machine for the cost model and write a profile file (--cost)", 1},
    {"serve", cmd_serve, "a data server of an MPI training job (mpirun ... train ... : ... serve --data DIR)", 0},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void usage(FILE *f) {
    fprintf(f, "usage: bytescale <command> [flags]   (bytescale <command> --help for its flags)\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nerrors: \"bytescale <command>: error: ...\" on stderr; exit status 2 for a usage error (bad or\n"
               "conflicting flags), 1 for a failure doing the work (README.md, \"Exit codes and errors\")\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (int i = 0; i < N_COMMANDS; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        // a flag given twice is refused for every command (prepare takes several --input)
        static const char *const repeatable[] = {"--input", NULL};
        if (cli_repeated_flag(argc - 1, argv + 1, !strcmp(commands[i].name, "prepare") ? repeatable : NULL) != 0) {
            return cli_usage_error(commands[i].name, "%s", bs_errmsg());
        }
        // before anything else, so that the exec repeats nothing (help needs no matmuls)
        int help = 0;
        for (int a = 2; a < argc; a++) help |= !strcmp(argv[a], "--help") || !strcmp(argv[a], "-h");
        if (commands[i].blas && !help) blas_core_reexec("bytescale", argv);
        return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "bytescale: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
