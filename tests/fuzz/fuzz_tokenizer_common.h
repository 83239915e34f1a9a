/* tests/fuzz/fuzz_tokenizer_common.h: a small self-contained byte-level BPE tokenizer.json for the
 * tokenizer fuzz targets (all 256 byte tokens, a few merges, NFC, the Qwen pre-tokenizer regex,
 * added tokens with every flag). */
#ifndef KVL_FUZZ_TOKENIZER_COMMON_H
#define KVL_FUZZ_TOKENIZER_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static char *fuzz_mini_tokenizer_json(void) {
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
#define APP(...) n += (size_t)snprintf(s + n, cap - n, __VA_ARGS__)
    APP("{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
        "{\"id\":262,\"content\":\"<|im_end|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"special\":true,\"normalized\":false},"
        "{\"id\":263,\"content\":\"<mask>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"special\":false,\"normalized\":false},"
        "{\"id\":264,\"content\":\"[W]\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"special\":false,\"normalized\":true},"
        "{\"id\":265,\"content\":\"caf\\u00e9\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"special\":false,\"normalized\":true}],"
        "\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
        "\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
        "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"ignore_merges\":false,\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        unsigned cp = kvl__bytelevel_char[b];
        char u[8];
        if (cp == '"' || cp == '\\') snprintf(u, sizeof u, "\\%c", (char)cp);
        else if (cp < 0x80) snprintf(u, sizeof u, "%c", (char)cp);
        else snprintf(u, sizeof u, "%c%c", (char)(0xc0 | (cp >> 6)), (char)(0x80 | (cp & 0x3f)));
        APP("\"%s\":%d,", u, b);
    }
    APP("\"\\u0120t\":256,\"he\":257,\"\\u0120the\":258,\"in\":259,\"\\u0120\\u0120\":260,\"ing\":261},"
        "\"merges\":[[\"\\u0120\",\"t\"],[\"h\",\"e\"],\"\\u0120t he\",[\"i\",\"n\"],[\"\\u0120\",\"\\u0120\"],\"in g\"]}}");
#undef APP
    return s;
}

#endif
