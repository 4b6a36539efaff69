// serve.c: `bytescale serve --data DIR`, a data server of an MPMD training job (docs/loader.md):
//
//   mpirun -np 4 bytescale train --data DIR ... : -np 2 bytescale serve --data DIR
//
// Each server holds about 1/S of the dataset's tokens (a contiguous range of documents), reports
// their metadata to the scheduler (the first training rank) and answers the training ranks' token
// requests until every one of them is done. `train --servers N` runs the same role on the last N
// ranks of a one-program job.
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "bytescale/comm.h"
#include "bytescale/error.h"
#include "bytescale/loader.h"
#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np N bytescale train --data DIR [flags] : -np S bytescale serve --data DIR [flags]\n"
            "\n"
            "A data server of the job: holds about 1/S of DIR (a contiguous range of documents), tells the\n"
            "scheduler (the first training rank) their lengths, and answers the training ranks' requests for\n"
            "token ranges until they are done. DIR is a prepared dataset (`bytescale prepare`), or a directory\n"
            "of text files, every file a document, which the servers tokenize themselves: training starts\n"
            "from the text without a prepare step (a file is refused). Every server must see the same DIR.\n"
            "One program can do the same: mpirun -np N+S bytescale train --servers S --data DIR ...\n"
            "With train --tp T --pp P, N = T x P x H and only tp rank 0 of the first stage (inputs) and of\n"
            "the last (targets) ask, for their tp group; the scheduler tells the servers which ranks these are.\n"
            "\n"
            "  --data DIR         the dataset or text directory (default data/go-byte)\n"
            "text directories only:\n"
            "  --ext EXT          only files ending in EXT (default: every file)\n"
            "  --tokenizer NAME   byte (default) or gpt2\n"
            "  --bpe-ranks PATH   gpt2's rank file (default data/tiktoken/r50k_base.tiktoken)\n"
            "  --cache BYTES      tokens of recently used documents kept per server; others are tokenized\n"
            "                     again when asked for (suffixes K M G; default 256M)\n"
            "  --help             this text\n");
}

int cmd_serve_role(Comm *world, const LoaderServeConfig *cfg, const CommRoles *roles) {
    if (loader_serve(cfg, roles) == 0) {
        comm_mpi_finalize();
        return 0;
    }
    fprintf(stderr, "bytescale serve: error: data server %d (world rank %d): %s\n", roles->index, roles->world_rank,
            bs_errmsg());
    // A failed server ends the job itself, and never waits in MPI_Finalize: the training ranks abort
    // on the error it sent them, and Open MPI 4.1's mpirun can hang or crash when one process
    // aborts while another finalizes (every process aborting is safe).
    comm_abort(world, CLI_EXIT_FAILURE);
    return CLI_EXIT_FAILURE;
}

void serve_defaults(LoaderServeConfig *cfg, const char *dir) {
    *cfg = (LoaderServeConfig){.dir = dir,
                               .tokenizer = "byte",
                               .bpe_ranks = "data/tiktoken/r50k_base.tiktoken",
                               .cache_bytes = 256ll << 20};
}

int cmd_serve(int argc, char **argv) {
    enum { O_DATA = 1, O_EXT, O_TOK, O_RANKS, O_CACHE };
    static const struct option options[] = {
        {"data", required_argument, NULL, O_DATA},   {"ext", required_argument, NULL, O_EXT},
        {"tokenizer", required_argument, NULL, O_TOK}, {"bpe-ranks", required_argument, NULL, O_RANKS},
        {"cache", required_argument, NULL, O_CACHE}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *given[O_CACHE] = {0};
    int got = cli_read_flags(argc, argv, options, O_DATA, given, O_CACHE);
    if (got == 1) {
        usage(stdout);
        return 0;
    }
    if (got != 0) return cli_usage_error("serve", "%s", bs_errmsg());
    LoaderServeConfig cfg;
    serve_defaults(&cfg, given[O_DATA - O_DATA] ? given[O_DATA - O_DATA] : "data/go-byte");
    if (given[O_EXT - O_DATA]) cfg.ext = given[O_EXT - O_DATA];
    if (given[O_TOK - O_DATA]) cfg.tokenizer = given[O_TOK - O_DATA];
    if (given[O_RANKS - O_DATA]) cfg.bpe_ranks = given[O_RANKS - O_DATA];
    if (given[O_CACHE - O_DATA] && arg_int64("--cache", given[O_CACHE - O_DATA], &cfg.cache_bytes) != 0)
        return cli_usage_error("serve", "%s", bs_errmsg());
    if (strcmp(cfg.tokenizer, "byte") != 0 && strcmp(cfg.tokenizer, "gpt2") != 0)
        return cli_usage_error("serve", "--tokenizer %s: byte or gpt2", cfg.tokenizer);
    if (cfg.cache_bytes < 0) return cli_usage_error("serve", "--cache must be >= 0 bytes");
    if (!comm_launched_by_mpi())
        return cli_usage_error("serve", "a data server is a rank of an MPI job beside training ranks: mpirun -np N "
                                        "bytescale train --data %s ... : -np S bytescale serve --data %s",
                               cfg.dir, cfg.dir);
    Comm *comm;
    if (comm_mpi_init(&comm, &argc, &argv) != 0) cli_die("serve", "%s", bs_errmsg());
    CommRoles roles;
    if (comm_mpi_split_roles(comm, COMM_ROLE_SERVER, &roles) != 0) cli_rank_die(comm, "serve", bs_errmsg());
    return cmd_serve_role(comm, &cfg, &roles);
}
