/* service/tls.h: the TLS files of kvld and kvlingo-router (tls_cert, tls_key, tls_ca), read and
 * checked once at start with OpenSSL's libcrypto, so a wrong file is an error that names it and
 * says what is wrong (missing, unreadable, not PEM, expired, key of another certificate,
 * certificate not signed by the CA) instead of a handshake failure on the first call.
 *
 * The texts are handed to rpc/ (kvl__rpc_tls in rpc/rpc.h), which gives them to gRPC core's SSL
 * credentials.  One certificate serves both directions of a fleet member: its server identity
 * and its client certificate towards other members (mutual TLS), so it should carry both
 * serverAuth and clientAuth (or no extendedKeyUsage at all). */
#ifndef KVL_SVC_TLS_H
#define KVL_SVC_TLS_H

#include <stddef.h>

#include "kvlingo/status.h"

/* A PEM file larger than this is refused (a certificate chain is a few KiB). */
#define KVL_SVC_TLS_MAX_FILE (1u << 20)

typedef struct kvl__svc_tls {
    char *cert_pem;        /* NULL when no certificate was loaded                               */
    char *key_pem;
    char *ca_pem;          /* NULL when no CA was loaded                                        */
    char subject[256];     /* the certificate's subject, one line ("CN=kvld-a,O=fleet"), or "" */
    char not_after[64];    /* its expiry, as OpenSSL prints it, or ""                           */
} kvl__svc_tls;

/* Read and check the files.  `cert` and `key` go together (both or neither; NULL or "" =
 * none); `ca` may be NULL or "" for none.  Checks: each file exists, is readable, holds at most
 * KVL_SVC_TLS_MAX_FILE bytes and parses as PEM of its kind (certificates / an unencrypted
 * private key); the certificate is within its validity period; the key matches it; when a CA is
 * given, the certificate chains to it (extra certificates of the cert file are intermediates).
 * Errors: KVL_ERR_INVALID_ARG / KVL_ERR_NOT_FOUND / KVL_ERR_IO / KVL_ERR_FORMAT /
 * KVL_ERR_MISMATCH, each message naming the key (tls_cert, tls_key, tls_ca) and the path.  On
 * error nothing is held (no need to free). */
kvl_status kvl__svc_tls_load(const char *cert, const char *key, const char *ca, kvl__svc_tls *out);

/* Release the texts (the key is wiped first).  Idempotent. */
void kvl__svc_tls_free(kvl__svc_tls *t);

/* The message both servers print when they have neither TLS files nor `insecure`. */
#define KVL_SVC_TLS_REQUIRED_MSG \
    "no TLS certificate: set tls_cert/tls_key/tls_ca or pass --insecure to run plaintext"

/* Log a warning when the secret at `path` (`what`: the key's config name) is readable by every
 * user of the host (a private key, the fleet's ticket key): not refused, as mounted secrets
 * differ in their modes, but said at start. */
void kvl__svc_warn_if_world_readable(const char *what, const char *path);

#endif
