/* tests/fuzz/fuzz_openai_request.c: libFuzzer target for the router's OpenAI request parser
 * (router/openai_json.c: the body of POST /v1/chat/completions and /v1/completions) and the
 * error body it answers with.  The first byte picks the endpoint (chat or completions). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"

static int known(void *arg, const char *name) {
    (void)arg;
    return !strcmp(name, "qwen3-a") || !strcmp(name, "qwen3-b");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int chat = data[0] & 1;
    kvr_oai_req q;
    kvr_oai_error e;
    memset(&e, 0, sizeof e);
    if (kvr_oai_parse((const char *)data + 1, size - 1, chat, 512, known, NULL, &q, &e) == 0) {
        /* what a parse that succeeds promises its callers */
        if (q.n_stop < 0 || q.n_stop > KVR_OAI_MAX_STOP) __builtin_trap();
        for (int i = 0; i < q.n_stop; i++)
            if (!q.stop[i] || !q.stop[i][0]) __builtin_trap();
        if (chat && (!q.msgs || q.n_msgs < 1)) __builtin_trap();
        for (int i = 0; chat && i < q.n_msgs; i++)
            if (!q.msgs[i].role || !q.msgs[i].content) __builtin_trap();
        if (!chat && !q.prompt) __builtin_trap();
        if (q.max_tokens < 0 || q.max_tokens > 512) __builtin_trap();
    } else {
        if (e.http < 400 || e.http > 599 || !e.message[0]) __builtin_trap();
        free(kvr_oai_error_json(&e));
    }
    kvr_oai_req_clear(&q);
    return 0;
}
