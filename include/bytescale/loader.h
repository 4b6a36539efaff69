// loader.h: the remote data loader (docs/loader.md), ByteScale's three roles in one MPI job.
//
//   servers    each holds a disjoint part of a prepared dataset (a contiguous range of documents,
//              about 1/S of its tokens) or of a directory of text files that it tokenizes itself
//              (with a cache), reports that part's metadata (document ids, lengths, global
//              offsets) to the scheduler, then serves token ranges on request;
//   scheduler  the first training rank: it gathers every server's metadata into one DocIndex (no
//              tokens), samples every global batch from it, plans it, and sends every client the
//              plan with a loading plan (which server holds each of the batch's documents);
//   clients    the training ranks: each fetches exactly the token ranges of its own chunks (plus one
//              token past each chunk, for the label) from the servers that hold them, in the
//              prefetch thread, for the next step while the current one trains. With --tp / --pp
//              only the processes that need tokens fetch (the first stage's inputs, the last
//              stage's targets), one per tp group, which hands what it fetched to the group's
//              other members; a middle stage fetches nothing.
//
// The messages travel on a duplicate of the job's world communicator (comm_mpi_loader_handle), so
// they never meet a ring's. A client fetches from its prefetch thread while its main thread runs
// rings: that needs MPI_THREAD_MULTIPLE (Open MPI has it). Errors are messages that name the server,
// its world rank and the file or request; a server never answers a range it does not hold.
#ifndef BYTESCALE_LOADER_H
#define BYTESCALE_LOADER_H

#include <stdint.h>

#include "bytescale/comm.h"
#include "bytescale/microbatch.h"
#include "bytescale/shard.h"

// ---- servers ---------------------------------------------------------------------------------------

// Documents [*first, *end) of server i of n: the documents whose first token lies in the i-th of n
// equal parts of the dataset's tokens (every document goes to exactly one server).
void loader_part(const DocIndex *ix, int i, int n, int64_t *first, int64_t *end);

typedef struct {
    const char *dir;         // a prepared dataset (it holds index.bin), or text files to tokenize
    // text only: every file under dir (prepare's walk and order) is a document
    const char *ext;         // only files ending in ext; NULL = all
    const char *tokenizer;   // "byte" or "gpt2"
    const char *bpe_ranks;   // gpt2's rank file
    int64_t cache_bytes;     // tokens of recently used documents kept; the others are tokenized again
} LoaderServeConfig;

// Run data server roles->index. A prepared dataset: open it and hold the documents loader_part
// gives. Text files: list them as prepare does, take the files whose bytes lie in this server's 1/S
// of the corpus, tokenize each once for its length (the metadata), and tokenize again on request
// what the cache no longer holds. Then send the scheduler this part's metadata (or the reason it
// cannot), learn where its documents start, and answer requests until every client has said it is
// done. -1 + error when it could not serve (the scheduler was told, and ends the job).
int loader_serve(const LoaderServeConfig *cfg, const CommRoles *roles);

// ---- the scheduler ---------------------------------------------------------------------------------

// Receive every server's metadata into ix (documents and shards; ix->dir names the servers; no
// tokens) and which server holds each document: *doc_server (n_docs,), malloc'ed; tell every server
// where its documents start and the world ranks of the n_fetchers clients that will ask it (the
// only ones it answers, and it stops when they are done). -1 + error naming the server when one
// could not open its data, or when the parts disagree or do not cover the dataset exactly once.
int loader_gather_index(const CommRoles *roles, const int *fetchers, int n_fetchers, DocIndex *ix,
                        int32_t **doc_server);

// ---- clients -----------------------------------------------------------------------------------------

// World rank of training rank `client` (the clients' own communicator numbers them in world order).
int loader_world_rank(const CommRoles *roles, int client);

// One step's loading plan: the batch's documents, ascending, and the server of each.
typedef struct {
    int64_t *docs;     // (n,)
    int32_t *servers;  // (n,) index among the job's servers
    int64_t n;
} LoadPlan;

void load_plan_free(LoadPlan *lp);

// One range a client reads: tokens [src, src + n) of document doc, from server `server`.
typedef struct {
    int64_t doc, src, n;
    int server;
    int64_t got;  // tokens the server had (n, or fewer at the document's end)
    int64_t at;   // where they are in RemoteSource.tokens
} LoadRange;

// A client's fetching. One step's rows are read twice through the same code (step_rows_read): first
// with loader_recorder, which notes every range and answers zeros, then loader_fetch asks each
// server for all of its ranges in one request (all servers at once), and loader_replayer answers the
// second reading from what came back. So a step costs one round trip per server, not one per chunk.
// A tp group's members read the same rows: one of them (leader < 0) fetches and sends what came
// back to the others (members), which record the same ranges and take the answers from it.
typedef struct {
    const CommRoles *roles;
    LoadPlan *plan;      // the step being read
    LoadRange *ranges;   // (n_ranges,) in the order the rows asked for them
    int64_t n_ranges, cap_ranges, next;
    uint32_t *tokens;    // the fetched tokens, range after range
    int64_t tokens_cap;
    int misroute;        // test aid (BS_LOADER_MISROUTE=1): ask the next server instead
    int leader;          // world rank that fetches for this client; -1: it asks the servers itself
    int *members;        // (n_members,) world ranks this client hands its fetch to (its tp group)
    int n_members;
    double fetched;      // token bytes the last loader_fetch received from the servers (0 from a leader)
} RemoteSource;

TokenSource loader_recorder(RemoteSource *src);  // src->plan set; resets the ranges
// Every recorded range from its server, then the answers to the members; or, with a leader, the
// answers from it (an error it had is this client's error too).
int loader_fetch(RemoteSource *src);
TokenSource loader_replayer(RemoteSource *src);  // the same reads, answered from the fetch
// Tell every server this fetching client is done (each server stops after the last one).
int loader_client_done(const CommRoles *roles);

#endif
