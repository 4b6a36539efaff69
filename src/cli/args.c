// args.c: flag value parsing shared by the subcommands.
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
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

// ---- errors: one form, two exit codes (README.md "Exit codes and errors") ------------------------------

static void say_error(const char *command, const char *where, const char *fmt, va_list ap) {
    fprintf(stderr, "bytescale%s%s: error: %s", command ? " " : "", command ? command : "", where ? where : "");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int cli_usage_error(const char *command, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say_error(command, NULL, fmt, ap);
    va_end(ap);
    fprintf(stderr, "(bytescale %s --help lists the flags)\n", command);
    return CLI_EXIT_USAGE;
}

_Noreturn void cli_die(const char *command, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say_error(command, NULL, fmt, ap);
    va_end(ap);
    exit(CLI_EXIT_FAILURE);
}

static void say_rank_error(Comm *comm, const char *command, const char *msg, const char *hint) {
    char copy[2048], where[64] = "";
    snprintf(copy, sizeof copy, "%s", msg);  // msg may be bs_errmsg()'s buffer
    if (comm->size > 1) snprintf(where, sizeof where, "rank %d of %d: ", comm->rank, comm->size);
    fprintf(stderr, "bytescale %s: error: %s%s\n%s", command, where, copy, hint);
}

void cli_rank_die(Comm *comm, const char *command, const char *msg) {
    say_rank_error(comm, command, msg, "");
    if (comm->size == 1) exit(CLI_EXIT_FAILURE);
    comm_abort(comm, CLI_EXIT_FAILURE);
    exit(CLI_EXIT_FAILURE);
}

void cli_rank_usage(Comm *comm, const char *command, const char *msg) {
    char hint[96];
    snprintf(hint, sizeof hint, "(bytescale %s --help lists the flags)\n", command);
    say_rank_error(comm, command, msg, hint);
    if (comm->size == 1) exit(CLI_EXIT_USAGE);
    comm_abort(comm, CLI_EXIT_USAGE);
    exit(CLI_EXIT_USAGE);
}

// "--tp 8", "--pp 2" or "--tp 8 x --pp 2 = 16": a layout in the words of the flags that made it.
const char *cli_layout_flags(char *buf, size_t cap, int tp, int pp) {
    if (tp > 1 && pp > 1) snprintf(buf, cap, "--tp %d x --pp %d = %d", tp, pp, tp * pp);
    else if (pp > 1) snprintf(buf, cap, "--pp %d", pp);
    else snprintf(buf, cap, "--tp %d", tp);
    return buf;
}
