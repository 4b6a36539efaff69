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
            "usage: mpirun -np N bytescale train --data DIR [flags] : -np S bytescale serve --data DIR\n"
            "\n"
            "A data server of the job: holds about 1/S of the prepared dataset DIR (a contiguous range of\n"
            "documents), tells the scheduler (the first training rank) their lengths, and answers the\n"
            "training ranks' requests for token ranges until they are done. Every server must see the same\n"
            "dataset. One program can do the same: mpirun -np N+S bytescale train --servers S ...\n"
            "\n"
            "  --data DIR    the prepared dataset (default data/go-byte)\n"
            "  --help        this text\n");
}

int cmd_serve_role(const char *dir, const void *roles_ptr) {
    const CommRoles *roles = roles_ptr;
    int rc = loader_serve(dir, roles);
    if (rc != 0) fprintf(stderr, "bytescale serve: data server %d (world rank %d): error: %s\n", roles->index,
                         roles->world_rank, bs_errmsg());
    // the scheduler was told and ends the job; until then this server waits in MPI_Finalize
    comm_mpi_finalize();
    return rc == 0 ? 0 : 1;
}

int cmd_serve(int argc, char **argv) {
    static const struct option options[] = {
        {"data", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = "data/go-byte";
    opterr = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "", options, NULL)) != -1;) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == 'd') {
            dir = optarg;
            continue;
        }
        fprintf(stderr, "bytescale serve: error: %s\n",
                c == ':' ? "--data needs a value" : "unknown flag (bytescale serve --help lists them)");
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "bytescale serve: error: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!comm_launched_by_mpi()) {
        fprintf(stderr, "bytescale serve: error: a data server is a rank of an MPI job beside training ranks: "
                        "mpirun -np N bytescale train --data %s ... : -np S bytescale serve --data %s\n",
                dir, dir);
        return 2;
    }
    Comm *comm;
    if (comm_mpi_init(&comm, &argc, &argv) != 0) bs_die_errmsg();
    CommRoles roles;
    if (comm_mpi_split_roles(comm, COMM_ROLE_SERVER, &roles) != 0) {
        fprintf(stderr, "bytescale serve: error: %s\n", bs_errmsg());
        comm_abort(comm, 1);
    }
    return cmd_serve_role(dir, &roles);
}
