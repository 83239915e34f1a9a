/* tests/server/test_rpc_tls.c: the rpc/ layer over TLS, in one process, with certificates made
 * by the openssl command line at set-up (a CA, a server and a client certificate it signs, a
 * "rogue" CA with a client certificate of its own, a server certificate named only
 * kvld.internal): mutual TLS accepts the CA's client and reads its name; refuses a client
 * without a certificate, with the rogue CA's, a plaintext client and a client that does not
 * trust the server; server-only TLS accepts clients without certificates; the target name
 * override; metadata travels over TLS. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "file.h"
#include "rpc.h"

typedef struct pki {
    char dir[64];
    char *ca, *server, *server_key, *client, *client_key, *rogue_ca, *rogue, *rogue_key;
    char *named, *named_key;     /* a server certificate for DNS:kvld.internal only */
} pki;

static pki g;

static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

static char *slurp(const char *name) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", g.dir, name);
    char *out = NULL;
    size_t len;
    if (kvl__file_read(path, 1 << 20, 0, &out, &len) != KVL_OK) return NULL;
    return out;
}

#define EC "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"

static int make_ca(const char *name, const char *cn) {
    return sh("cd %s && openssl req -x509 " EC " -keyout %s-key.pem -out %s.pem -days 2 -subj /CN=%s "
              "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign "
              ">/dev/null 2>&1", g.dir, name, name, cn);
}

static int make_leaf(const char *ca, const char *name, const char *cn, const char *san, int serial) {
    return sh("cd %s && printf 'basicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth,clientAuth\\n"
              "subjectAltName=%s\\n' > %s.ext && openssl req " EC " -keyout %s-key.pem -out %s.csr "
              "-subj /CN=%s >/dev/null 2>&1 && openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s-key.pem "
              "-set_serial %d -days 2 -out %s.pem -extfile %s.ext >/dev/null 2>&1",
              g.dir, san, name, name, name, cn, name, ca, ca, serial, name, name);
}

static int group_setup(void **state) {
    (void)state;
    snprintf(g.dir, sizeof g.dir, "/tmp/kvl_rpc_tls_XXXXXX");
    if (!mkdtemp(g.dir)) return -1;
    const char *ip = "IP:127.0.0.1,DNS:localhost";
    if (make_ca("ca", "test-ca") || make_ca("rogue-ca", "rogue-ca") ||
        make_leaf("ca", "server", "test-server", ip, 1) || make_leaf("ca", "client", "test-client", ip, 2) ||
        make_leaf("rogue-ca", "rogue", "test-client", ip, 3) ||
        make_leaf("ca", "named", "named-server", "DNS:kvld.internal", 4)) {
        fprintf(stderr, "openssl failed making the test certificates in %s\n", g.dir);
        return -1;
    }
    g.ca = slurp("ca.pem");
    g.server = slurp("server.pem");
    g.server_key = slurp("server-key.pem");
    g.client = slurp("client.pem");
    g.client_key = slurp("client-key.pem");
    g.rogue_ca = slurp("rogue-ca.pem");
    g.rogue = slurp("rogue.pem");
    g.rogue_key = slurp("rogue-key.pem");
    g.named = slurp("named.pem");
    g.named_key = slurp("named-key.pem");
    return g.ca && g.server && g.client && g.rogue && g.named && g.named_key ? 0 : -1;
}

static int group_teardown(void **state) {
    (void)state;
    sh("rm -rf %s", g.dir);
    char **all[] = {&g.ca, &g.server, &g.server_key, &g.client, &g.client_key, &g.rogue_ca,
                    &g.rogue, &g.rogue_key, &g.named, &g.named_key};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(*all[i]);
    return 0;
}

/* replies the client certificate's CN and the x-test metadata: "CN|md" */
static void who(kvl__rpc_call *call, const uint8_t *req, size_t len, void *user) {
    (void)req; (void)len; (void)user;
    char cn[128] = "", md[64] = "", out[200];
    size_t n = kvl__rpc_call_peer_cn(call, cn, sizeof cn);
    if (n == 0 || n == SIZE_MAX) cn[0] = '\0';
    n = kvl__rpc_call_metadata(call, "x-test", md, sizeof md);
    if (n == 0 || n == SIZE_MAX) md[0] = '\0';
    snprintf(out, sizeof out, "%s|%s", cn, md);
    kvl__rpc_call_reply(call, (const uint8_t *)out, strlen(out));
}

static kvl__rpc_server *start(const char *cert, const char *key, int require) {
    kvl__rpc_tls tls = {.cert_pem = cert, .key_pem = key, .ca_pem = g.ca, .require_client_cert = require};
    kvl__rpc_server_params p = kvl__rpc_server_default_params();
    p.tls = &tls;   /* copied by the create call: a stack value is enough */
    kvl__rpc_server *srv = NULL;
    assert_int_equal(kvl__rpc_server_create(&p, &srv), KVL_OK);
    assert_int_equal(kvl__rpc_server_add_method(srv, "/t.S/Who", KVL_RPC_UNARY, who, NULL), KVL_OK);
    assert_int_equal(kvl__rpc_server_start(srv), KVL_OK);
    return srv;
}

/* One call to /t.S/Who as a client with `tls`; returns the status and the reply in buf. */
static grpc_status_code call_who(kvl__rpc_server *srv, const char *host, const kvl__rpc_tls *tls,
                                 char *buf, size_t cap) {
    char target[96];
    snprintf(target, sizeof target, "%s:%d", host, kvl__rpc_server_port(srv));
    kvl__rpc_client *cli = NULL;
    assert_int_equal(kvl__rpc_client_create(target, 0, tls, &cli), KVL_OK);
    assert_int_equal(kvl__rpc_client_set_metadata(cli, "x-test", "over-tls"), KVL_OK);
    kvl__rpc_result r;
    assert_int_equal(kvl__rpc_client_unary(cli, "/t.S/Who", NULL, 0, 5000, &r), KVL_OK);
    grpc_status_code code = r.code;
    snprintf(buf, cap, "%.*s", (int)r.len, r.data ? (const char *)r.data : "");
    kvl__rpc_result_clear(&r);
    kvl__rpc_client_free(cli);
    return code;
}

static void test_mutual_tls(void **state) {
    (void)state;
    kvl__rpc_server *srv = start(g.server, g.server_key, 1);
    char buf[256];
    kvl__rpc_tls good = {.ca_pem = g.ca, .cert_pem = g.client, .key_pem = g.client_key};
    assert_int_equal(call_who(srv, "127.0.0.1", &good, buf, sizeof buf), GRPC_STATUS_OK);
    assert_string_equal(buf, "test-client|over-tls");
    kvl__rpc_tls nocert = {.ca_pem = g.ca};
    assert_int_equal(call_who(srv, "127.0.0.1", &nocert, buf, sizeof buf), GRPC_STATUS_UNAVAILABLE);
    kvl__rpc_tls rogue = {.ca_pem = g.ca, .cert_pem = g.rogue, .key_pem = g.rogue_key};
    assert_int_equal(call_who(srv, "127.0.0.1", &rogue, buf, sizeof buf), GRPC_STATUS_UNAVAILABLE);
    kvl__rpc_tls untrusting = {.ca_pem = g.rogue_ca, .cert_pem = g.client, .key_pem = g.client_key};
    assert_int_equal(call_who(srv, "127.0.0.1", &untrusting, buf, sizeof buf), GRPC_STATUS_UNAVAILABLE);
    kvl__rpc_tls plain = {.insecure = 1};
    assert_int_equal(call_who(srv, "127.0.0.1", &plain, buf, sizeof buf), GRPC_STATUS_UNAVAILABLE);
    /* after the refusals the server still serves */
    /* (127.0.0.1, not localhost: name resolution goes through c-ares, whose resolver leaks a
     * few bytes per process that LeakSanitizer reports) */
    assert_int_equal(call_who(srv, "127.0.0.1", &good, buf, sizeof buf), GRPC_STATUS_OK);
    kvl__rpc_server_free(srv);
}

static void test_server_tls(void **state) {
    (void)state;
    kvl__rpc_server *srv = start(g.server, g.server_key, 0);
    char buf[256];
    kvl__rpc_tls nocert = {.ca_pem = g.ca};
    assert_int_equal(call_who(srv, "127.0.0.1", &nocert, buf, sizeof buf), GRPC_STATUS_OK);
    assert_string_equal(buf, "|over-tls");   /* no client certificate: no name */
    kvl__rpc_tls untrusting = {.ca_pem = g.rogue_ca};
    assert_int_equal(call_who(srv, "127.0.0.1", &untrusting, buf, sizeof buf), GRPC_STATUS_UNAVAILABLE);
    kvl__rpc_server_free(srv);
}

static void test_target_name(void **state) {
    (void)state;
    kvl__rpc_server *srv = start(g.named, g.named_key, 0);
    char buf[256];
    kvl__rpc_tls by_ip = {.ca_pem = g.ca};   /* the certificate does not name 127.0.0.1 */
    assert_int_equal(call_who(srv, "127.0.0.1", &by_ip, buf, sizeof buf), GRPC_STATUS_UNAVAILABLE);
    kvl__rpc_tls named = {.ca_pem = g.ca, .target_name = "kvld.internal"};
    assert_int_equal(call_who(srv, "127.0.0.1", &named, buf, sizeof buf), GRPC_STATUS_OK);
    kvl__rpc_server_free(srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutual_tls),
        cmocka_unit_test(test_server_tls),
        cmocka_unit_test(test_target_name),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
