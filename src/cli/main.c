// main.c: `bytescale <command> [flags]`. One file per command in src/cli.
#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"
#include "cli/cli.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"plan", cmd_plan, "plan a global batch with an HDP policy (static, naive, balance)"},
    {"simulate", cmd_simulate, "simulate a training step of each policy on a modelled GPU cluster"},
    {"prepare", cmd_prepare, "turn text files into token shards plus a document index"},
    {"train", cmd_train, "train a model on a prepared dataset (one process; checkpoints, resume, metrics)"},
    {"profile", cmd_profile, "measure this machine for the cost model and write a profile file (--cost)"},
    {"serve", cmd_serve, "a data server of an MPI training job (mpirun ... train ... : ... serve --data DIR)"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void usage(FILE *f) {
    fprintf(f, "usage: bytescale <command> [flags]   (bytescale <command> --help for its flags)\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
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
            fprintf(stderr, "bytescale %s: error: %s\n(bytescale %s --help lists the flags)\n", commands[i].name,
                    bs_errmsg(), commands[i].name);
            return 2;
        }
        return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "bytescale: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
