// args.c: flag value parsing shared by the subcommands.
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/comm.h"
#include "bytescale/error.h"
#include "cli/cli.h"

int arg_int64(const char *flag, const char *text, int64_t *out) {
    if (!text || !*text) return bs_fail("%s: expected an integer", flag);
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text) return bs_fail("%s: '%s' is not an integer", flag, text);
    int64_t mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1ll << 10; end++; break;
    case 'm': case 'M': mult = 1ll << 20; end++; break;
    case 'g': case 'G': mult = 1ll << 30; end++; break;
    default: break;
    }
    if (*end) return bs_fail("%s: '%s' is not an integer (suffixes K, M, G allowed)", flag, text);
    if (v > LLONG_MAX / mult || v < LLONG_MIN / mult) return bs_fail("%s: '%s' is out of range", flag, text);
    *out = (int64_t)v * mult;
    return 0;
}

int arg_int(const char *flag, const char *text, int *out) {
    int64_t v = 0;  // set by arg_int64 on success (GCC cannot see that bs_fail returns -1)
    if (arg_int64(flag, text, &v) != 0) return -1;
    if (v < INT_MIN || v > INT_MAX) return bs_fail("%s: '%s' is out of range", flag, text);
    *out = (int)v;
    return 0;
}

int arg_double(const char *flag, const char *text, double *out) {
    if (!text || !*text) return bs_fail("%s: expected a number", flag);
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v)) return bs_fail("%s: '%s' is not a number", flag, text);
    *out = v;
    return 0;
}

// A retired name stays an error with a pointer to its replacement rather than becoming "unknown flag":
// scripts written for the old names then say how to fix themselves.
static const struct {
    const char *flag, *message;
} retired[] = {
    {"--dataset", "--dataset is gone: --lengths FILE for a lengths file (bytescale plan), --dist SPEC for a "
                  "length distribution"},
    {"--hardware-file", "--hardware-file is gone: --hardware FILE reads a profile file (a path with a '/' or "
                        "ending in .json)"},
    {"--cost-file", "--cost-file is gone: --cost FILE"},
};

const char *cli_retired_flag(const char *arg) {
    if (!arg) return NULL;
    size_t n = strcspn(arg, "=");  // "--dataset=x" names --dataset
    for (size_t i = 0; i < sizeof retired / sizeof retired[0]; i++)
        if (strlen(retired[i].flag) == n && !strncmp(arg, retired[i].flag, n)) return retired[i].message;
    return NULL;
}

int cli_read_flags(int argc, char **argv, const struct option *options, int first, const char **given, int n_given) {
    opterr = 0;  // our own messages
    optind = 1;
    for (;;) {
        int at = -1;
        int opt = getopt_long(argc, argv, ":h", options, &at);
        if (opt == -1) break;
        if (opt == 'h') return 1;
        if (opt == ':') return bs_fail("%s needs a value", argv[optind - 1]);
        if (opt == '?' || opt < first || opt - first >= n_given) return bs_fail("unknown flag '%s'", argv[optind - 1]);
        // a flag given twice (an abbreviation too: --hard a --hardware b) is refused, not last-wins
        if (given[opt - first])
            return bs_fail("--%s is given twice ('%s', then '%s'): give it once", at >= 0 ? options[at].name : "?",
                           given[opt - first], optarg ? optarg : "");
        given[opt - first] = optarg;
    }
    if (optind < argc) return bs_fail("unexpected argument '%s'", argv[optind]);
    return 0;
}

int cli_repeated_flag(int argc, char **argv, const char *const *repeatable) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;  // the end of the flags
        if (strncmp(a, "--", 2) != 0 || !a[2]) continue;
        size_t n = strcspn(a, "=");  // "--out=x" names --out
        int ok = n == 6 && !strncmp(a, "--help", 6);
        for (int r = 0; !ok && repeatable && repeatable[r]; r++)
            ok = strlen(repeatable[r]) == n && !strncmp(a, repeatable[r], n);
        for (int j = 1; !ok && j < i; j++)
            if (strcspn(argv[j], "=") == n && !strncmp(argv[j], a, n))
                return bs_fail("%.*s is given twice: give it once (a flag is not overridden by a later one)", (int)n, a);
    }
    return 0;
}

void cli_rank_die(Comm *comm, const char *command, const char *msg) {
    char copy[2048];
    snprintf(copy, sizeof copy, "%s", msg);  // msg may be bs_errmsg()'s buffer, which bs_die reuses
    if (comm->size == 1) bs_die("%s", copy);
    fprintf(stderr, "bytescale %s: rank %d of %d: error: %s\n", command, comm->rank, comm->size, copy);
    comm_abort(comm, 1);
    exit(1);
}
