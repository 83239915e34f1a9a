/* service/tls.c: reading and checking the TLS files (see tls.h), on OpenSSL's libcrypto. */
#include "tls.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/x509_vfy.h>

#include "error.h"
#include "log.h"
#include "file.h"

/* The PEM text of `path` (key name `what` in messages). */
static kvl_status read_pem(const char *what, const char *path, char **out) {
    size_t len;
    kvl_status st = kvl__file_read(path, KVL_SVC_TLS_MAX_FILE, 1, out, &len);
    if (st == KVL_ERR_NOT_FOUND)
        return kvl__errorf(KVL_ERR_NOT_FOUND, "%s '%s': no such file", what, path);
    if (st == KVL_ERR_RANGE)
        return kvl__errorf(KVL_ERR_RANGE, "%s '%s': larger than %u bytes, not a PEM file", what,
                          path, KVL_SVC_TLS_MAX_FILE);
    if (st != KVL_OK) {   /* a directory, no permission, an I/O error: the reader's reason */
        char why[512];
        const char *e = kvl_last_error(), *tail = strstr(e, ": ");
        snprintf(why, sizeof why, "%s", tail && strstr(e, path) ? tail + 2 : e);
        return kvl__errorf(st, "%s '%s': %s", what, path, why);
    }
    if (!strstr(*out, "-----BEGIN ")) {
        free(*out);
        *out = NULL;
        return kvl__errorf(KVL_ERR_FORMAT, "%s '%s': not a PEM file (no -----BEGIN line)", what, path);
    }
    return KVL_OK;
}

/* Every certificate of a PEM text, in order; NULL when there is none. */
static STACK_OF(X509) *read_certs(const char *pem) {
    BIO *b = BIO_new_mem_buf(pem, -1);
    if (!b) return NULL;
    STACK_OF(X509) *sk = sk_X509_new_null();
    X509 *x;
    while (sk && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL)
        if (!sk_X509_push(sk, x)) X509_free(x);
    ERR_clear_error();   /* the end of the text reads as a "no start line" error */
    BIO_free(b);
    if (sk && sk_X509_num(sk) == 0) {
        sk_X509_free(sk);
        sk = NULL;
    }
    return sk;
}

void kvl__svc_warn_if_world_readable(const char *what, const char *path) {
    struct stat sb;
    if (path && stat(path, &sb) == 0 && (sb.st_mode & S_IROTH))
        kvl__svc_log("warn", "msg=key_file_readable key=%s file=\"%s\" mode=%03o detail=\"readable by every user "
                     "of this host: whoever reads it can act as this fleet member (chmod o-r)\"", what, path,
                     (unsigned)(sb.st_mode & 0777));
}

/* An encrypted key would make OpenSSL ask for a passphrase on the terminal; refuse instead. */
static int no_passphrase(char *buf, int size, int rwflag, void *u) {
    (void)buf; (void)size; (void)rwflag; (void)u;
    return -1;
}

static const char *openssl_reason(void) {
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown reason";
}

static void describe(X509 *x, kvl__svc_tls *t) {
    BIO *b = BIO_new(BIO_s_mem());
    if (!b) return;
    if (X509_NAME_print_ex(b, X509_get_subject_name(x), 0, XN_FLAG_RFC2253) >= 0) {
        int n = BIO_read(b, t->subject, (int)sizeof t->subject - 1);
        t->subject[n > 0 ? n : 0] = '\0';
    }
    (void)BIO_reset(b);
    if (ASN1_TIME_print(b, X509_get0_notAfter(x))) {
        int n = BIO_read(b, t->not_after, (int)sizeof t->not_after - 1);
        t->not_after[n > 0 ? n : 0] = '\0';
    }
    BIO_free(b);
}

/* The checks that need the parsed objects (see tls.h). */
static kvl_status check(const char *cert, const char *key, const char *ca, kvl__svc_tls *t) {
    kvl_status st = KVL_OK;
    STACK_OF(X509) *chain = NULL, *roots = NULL;
    EVP_PKEY *pk = NULL;
    X509_STORE *store = NULL;
    X509_STORE_CTX *ctx = NULL;
    if (t->cert_pem) {
        chain = read_certs(t->cert_pem);
        if (!chain) {
            st = kvl__errorf(KVL_ERR_FORMAT, "tls_cert '%s': no PEM certificate in the file", cert);
            goto out;
        }
        X509 *leaf = sk_X509_value(chain, 0);
        describe(leaf, t);
        if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
            st = kvl__errorf(KVL_ERR_FORMAT, "tls_cert '%s' (%s): not valid yet", cert, t->subject);
            goto out;
        }
        if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
            st = kvl__errorf(KVL_ERR_FORMAT, "tls_cert '%s' (%s): expired on %s", cert, t->subject,
                            t->not_after);
            goto out;
        }
        /* a fleet member's certificate is a server's and, towards the other members, a
         * client's: a certificate that limits its use must allow both (UINT32_MAX: no
         * extendedKeyUsage extension, any use), or the handshake fails later with only a closed
         * socket to show for it */
        /* a CA's certificate as a member's own: it would sign what it likes in the fleet's
         * name if its key leaked with the node, and is almost always the wrong file */
        if (X509_check_ca(leaf) >= 1 && X509_get_extension_flags(leaf) & EXFLAG_CA) {
            st = kvl__errorf(KVL_ERR_FORMAT, "tls_cert '%s' (%s): a CA certificate (basicConstraints "
                            "CA:TRUE), not a fleet member's own; give the node's certificate, signed by "
                            "that CA", cert, t->subject);
            goto out;
        }
        uint32_t xku = X509_get_extended_key_usage(leaf);
        if (xku != UINT32_MAX && (!(xku & XKU_SSL_SERVER) || !(xku & XKU_SSL_CLIENT))) {
            st = kvl__errorf(KVL_ERR_FORMAT, "tls_cert '%s' (%s): its extendedKeyUsage lacks %s; a "
                            "fleet member's certificate needs serverAuth and clientAuth (it serves, "
                            "and is a client of the other members)", cert, t->subject,
                            !(xku & XKU_SSL_SERVER) ? "serverAuth" : "clientAuth");
            goto out;
        }
        BIO *b = BIO_new_mem_buf(t->key_pem, -1);
        pk = b ? PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL) : NULL;
        BIO_free(b);
        if (!pk) {
            st = kvl__errorf(KVL_ERR_FORMAT, "tls_key '%s': not an unencrypted PEM private key (%s)",
                            key, openssl_reason());
            goto out;
        }
        if (X509_check_private_key(leaf, pk) != 1) {
            st = kvl__errorf(KVL_ERR_MISMATCH, "tls_key '%s' is not the key of tls_cert '%s' (%s)",
                            key, cert, t->subject);
            goto out;
        }
    }
    if (t->ca_pem) {
        roots = read_certs(t->ca_pem);
        if (!roots) {
            st = kvl__errorf(KVL_ERR_FORMAT, "tls_ca '%s': no PEM certificate in the file", ca);
            goto out;
        }
    }
    if (chain && roots) {
        store = X509_STORE_new();
        ctx = X509_STORE_CTX_new();
        if (!store || !ctx) {
            st = kvl__errorf(KVL_ERR_NOMEM, "tls: certificate store");
            goto out;
        }
        for (int i = 0; i < sk_X509_num(roots); i++) X509_STORE_add_cert(store, sk_X509_value(roots, i));
        STACK_OF(X509) *inter = sk_X509_new_null();
        for (int i = 1; inter && i < sk_X509_num(chain); i++) sk_X509_push(inter, sk_X509_value(chain, i));
        int ok = X509_STORE_CTX_init(ctx, store, sk_X509_value(chain, 0), inter) == 1 &&
                 X509_verify_cert(ctx) == 1;
        if (!ok)
            st = kvl__errorf(KVL_ERR_MISMATCH, "tls_cert '%s' (%s) does not verify against tls_ca "
                            "'%s': %s", cert, t->subject, ca,
                            X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
        X509_STORE_CTX_cleanup(ctx);
        sk_X509_free(inter);   /* the certificates belong to `chain` */
    }
out:
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    EVP_PKEY_free(pk);
    if (chain) sk_X509_pop_free(chain, X509_free);
    if (roots) sk_X509_pop_free(roots, X509_free);
    ERR_clear_error();
    return st;
}

kvl_status kvl__svc_tls_load(const char *cert, const char *key, const char *ca, kvl__svc_tls *out) {
    memset(out, 0, sizeof *out);
    int hc = cert && cert[0], hk = key && key[0], ha = ca && ca[0];
    if (hc && !hk) return kvl__errorf(KVL_ERR_INVALID_ARG, "tls_cert '%s' is set but tls_key is not", cert);
    if (hk && !hc) return kvl__errorf(KVL_ERR_INVALID_ARG, "tls_key '%s' is set but tls_cert is not", key);
    kvl_status st = KVL_OK;
    if (hc) st = read_pem("tls_cert", cert, &out->cert_pem);
    if (st == KVL_OK && hk) st = read_pem("tls_key", key, &out->key_pem);
    if (st == KVL_OK && ha) st = read_pem("tls_ca", ca, &out->ca_pem);
    if (st == KVL_OK) st = check(cert, key, ca, out);
    /* once the file is known to hold the key: a certificate given as the key is refused above,
     * not warned about as a readable key first */
    if (st == KVL_OK && hk) kvl__svc_warn_if_world_readable("tls_key", key);
    if (st != KVL_OK) kvl__svc_tls_free(out);
    return st;
}

void kvl__svc_tls_free(kvl__svc_tls *t) {
    if (!t) return;
    if (t->key_pem) OPENSSL_cleanse(t->key_pem, strlen(t->key_pem));
    free(t->cert_pem);
    free(t->key_pem);
    free(t->ca_pem);
    memset(t, 0, sizeof *t);
}
