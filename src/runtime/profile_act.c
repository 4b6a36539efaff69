// profile_act.c: activation bytes, the cost model's act_token, act_const, act_shared_token and
// act_shared_const (profile.h, docs/profile.md "Memory"). Not timed: read from the engine's own accounting
// (llama_activation_bytes, llama_resident_bytes), so the planner's capacity is the engine's.
#include <math.h>

#include "bytescale/error.h"
#include "bytescale/llama.h"
#include "profile_internal.h"

// One layer's block and the shared buffers of model m at T tokens, by the engine's accounting: the
// block is the difference of two layer counts laid out alike (3 or more layers page every block, so
// the model's own count and the next; else 1 and 2); the shared part is what a rank holds beyond
// its resident layers at r = 1 (llama_resident_bytes: two layers when the model offloads, all of
// them when it cannot).
static void engine_bytes(const ModelConfig *m, int T, double *layer, double *shared) {
    ModelConfig a = *m, b = *m;
    a.n_layers = m->n_layers >= 3 ? m->n_layers : 1;
    b.n_layers = a.n_layers + 1;
    *layer = (double)(llama_activation_bytes(&b, T) - llama_activation_bytes(&a, T));
    int resident = m->n_layers >= 3 ? 2 : m->n_layers;
    *shared = (double)llama_resident_bytes(m, T, 1.0) - resident * *layer;
}

int profile_engine_act(const ModelConfig *m, CostModel *cm, double *layer_margin, double *shared_margin) {
    // Every tensor is T x (a whole number of floats) and the head's logits stop growing at the
    // chunk's rows (at most 2M / vocab): from T0, the first multiple of 1024 past that, every
    // multiple of 1024 tokens is whole pages, so the accounting there is exactly a line.
    int T0 = ((1 << 21) / (m->vocab_size > 0 ? m->vocab_size : 1) / 1024 + 1) * 1024, T1 = T0 + 1024;
    double l0, s0, l1, s1;
    engine_bytes(m, T0, &l0, &s0);
    engine_bytes(m, T1, &l1, &s1);
    double la = (l1 - l0) / 1024, lb = l0 - la * T0, sa = (s1 - s0) / 1024, sb = s0 - sa * T0;
    if (!(la > 0) || sa < 0) return bs_fail("model %s: the engine's activation accounting is not increasing", m->name);
    // Elsewhere the tensors round up to 64 bytes and blocks to pages, and below T0 the logits are
    // fewer: the rounding repeats every 1024 tokens, so the largest excess over the line on 1 ..
    // T1 + 1024 is the largest anywhere. Raising the constants by it makes the lines upper bounds.
    double lm = 0, sm = 0;
    for (int T = 1; T <= T1 + 1024; T++) {
        double l, sh;
        engine_bytes(m, T, &l, &sh);
        lm = fmax(lm, l - (la * T + lb));
        sm = fmax(sm, sh - (sa * T + sb));
    }
    cm->act_token = la, cm->act_const = fmax(0.0, lb + lm);
    cm->act_shared_token = sa, cm->act_shared_const = fmax(0.0, sb + sm);
    if (layer_margin) *layer_margin = lm;
    if (shared_margin) *shared_margin = sm;
    return 0;
}

int profile_measure_act(Profile *p) {
    const ProfileConfig *c = &p->cfg;
    if (profile_engine_act(c->model, &p->cm, &p->act_margin, &p->act_shared_margin) != 0) return -1;
    p->act_max_dev = 0;
    for (int i = 0; i < c->n_lengths; i++) {
        ProfilePoint *pt = &p->pts[i];
        pt->s = c->lengths[i];
        engine_bytes(c->model, (int)pt->s, &pt->act_bytes, &pt->shared_bytes);
        p->act_max_dev = fmax(p->act_max_dev, cost_layer_act(&p->cm, pt->s) - pt->act_bytes);
    }
    return 0;
}

// (profile_internal.h)
void profile_act_print(FILE *f, const Profile *p) {
    const CostModel *cm = &p->cm, *d = &p->derived;
    fprintf(f, "activations: the engine's accounting (llama_activation_bytes, llama_resident_bytes), upper lines:\n");
    fprintf(f, "  Act(s) = act_token s + act_const = %.17g s + %.17g bytes per layer (rounding margin %.0f)\n",
            cm->act_token, cm->act_const, p->act_margin);
    fprintf(f, "  shared = act_shared_token s + act_shared_const = %.17g s + %.17g bytes per rank (margin %.0f)\n",
            cm->act_shared_token, cm->act_shared_const, p->act_shared_margin);
    fprintf(f, "  the `cpu` profile derives act_token %.0f (it counts the norm and SwiGLU outputs, which the engine "
               "recomputes)\n\n",
            d->act_token);
}

// (profile_internal.h)
cJSON *profile_act_json(const Profile *p) {
    cJSON *act = cJSON_CreateObject();
    cJSON_AddStringToObject(act, "method", "one layer = llama_activation_bytes(L + 1 layers) - llama_activation_bytes("
                                           "L) (L = the model's layers if >= 3, else 1); shared = llama_resident_bytes("
                                           "s, r = 1) - the resident layers; each the line through two lengths where "
                                           "the accounting is exact, its constant raised by the rounding margin");
    cJSON_AddNumberToObject(act, "layer_margin_bytes", p->act_margin);
    cJSON_AddNumberToObject(act, "shared_margin_bytes", p->act_shared_margin);
    cJSON_AddNumberToObject(act, "max_deviation_bytes", p->act_max_dev);
    cJSON *apts = cJSON_AddArrayToObject(act, "points");
    for (int i = 0; i < p->n_pts; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "s", (double)p->pts[i].s);
        cJSON_AddNumberToObject(e, "bytes", p->pts[i].act_bytes);
        cJSON_AddNumberToObject(e, "shared_bytes", p->pts[i].shared_bytes);
        cJSON_AddItemToArray(apts, e);
    }
    return act;
}
