/* router/auth.c: who is calling.  The key file is loaded at start and on SIGHUP (tenants.h);
 * every Router RPC and every OpenAI API request (health checks aside) names its tenant with
 * `authorization: Bearer KEY`; refusals and quota refusals are counted by reason and tenant.
 *
 * A router without a key file serves everyone as tenant "default", and only when it runs
 * insecure (a loopback demo, tests): otherwise it would serve every session to anyone who can
 * reach the port. */
#include "router.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"

static const char *const k_reasons[] = {"missing", "unknown", "forbidden"};

kvl_status kvr_auth_load(const kvr_config *cfg, kvr_tenants **out) {
    *out = NULL;
    if (!cfg->api_keys) return kvr_tenants_anonymous(out);
    kvl_status s = kvr_tenants_load(cfg->api_keys, out);
    if (s) {
        char pre[600];
        if (cfg->api_keys_line > 0)
            snprintf(pre, sizeof pre, "%s:%d: key 'api_keys'", cfg->path, cfg->api_keys_line);
        else
            snprintf(pre, sizeof pre, "--api-keys");
        kvl__error_prefix(s, pre);
    }
    return s;
}

kvl_status kvr_auth_check_start(const kvr_config *cfg) {
    if (cfg->api_keys || cfg->insecure) return KVL_OK;
    return kvl__errorf(KVL_ERR_INVALID_ARG, "%s: no api_keys: without a key file every client could read "
                      "every session; give api_keys: FILE (or --api-keys FILE), or run insecure (--insecure "
                      "or insecure: true, anonymous clients are tenant \"default\")", cfg->path);
}

void kvr_auth_declare(kvr_router *r) {
    char lab[160], q[140], name[KVR_TENANT_NAME_MAX];
    for (int i = 0; i < 3; i++) {
        snprintf(lab, sizeof lab, "reason=\"%s\"", k_reasons[i]);
        kvr_metrics_inc(r->metrics, "kvlingo_router_auth_refused_total", lab, 0);
    }
    /* tenant names come from the key file (bounded, [A-Za-z0-9._-]): a bounded label set */
    for (int i = 0; i < kvr_tenants_count(r->tenants); i++) {
        kvr_tenants_name(r->tenants, i, name, sizeof name);
        kvl__svc_prom_label_value(q, sizeof q, name);
        snprintf(lab, sizeof lab, "tenant=\"%s\",quota=\"max_sessions\"", q);
        kvr_metrics_inc(r->metrics, "kvlingo_router_quota_refused_total", lab, 0);
        snprintf(lab, sizeof lab, "tenant=\"%s\",quota=\"tokens_per_minute\"", q);
        kvr_metrics_inc(r->metrics, "kvlingo_router_quota_refused_total", lab, 0);
        snprintf(lab, sizeof lab, "tenant=\"%s\",quota=\"max_concurrent_turns\"", q);
        kvr_metrics_inc(r->metrics, "kvlingo_router_quota_refused_total", lab, 0);
    }
}

static int file_sig(const char *path, unsigned long long sig[4]) {
    struct stat st;
    if (stat(path, &st)) return -1;   /* stat follows the ..data symlink of a Secret volume */
    sig[0] = (unsigned long long)st.st_dev;
    sig[1] = (unsigned long long)st.st_ino;
    sig[2] = (unsigned long long)st.st_size;
    sig[3] = (unsigned long long)st.st_mtim.tv_sec * 1000000000ULL + (unsigned long long)st.st_mtim.tv_nsec;
    return 0;
}

void kvr_auth_mark(kvr_router *r) {
    if (r->cfg->api_keys && file_sig(r->cfg->api_keys, r->keys_sig)) memset(r->keys_sig, 0, sizeof r->keys_sig);
}

void kvr_auth_poll(kvr_router *r, double now) {
    if (!r->cfg->api_keys || r->cfg->api_keys_reload_s <= 0 || now - r->keys_checked < r->cfg->api_keys_reload_s)
        return;
    r->keys_checked = now;
    unsigned long long sig[4];
    if (file_sig(r->cfg->api_keys, sig)) memset(sig, 0, sizeof sig);
    if (!memcmp(sig, r->keys_sig, sizeof sig)) return;
    memcpy(r->keys_sig, sig, sizeof sig);   /* a bad file is reported once, not every tick */
    if (kvr_auth_reload(r))
        kvl__svc_log_text("warn", "key file changed, reload failed, keeping the old keys: %s", kvl_last_error());
}

kvl_status kvr_auth_reload(kvr_router *r) {
    if (!r->cfg->api_keys) return KVL_OK;
    kvr_auth_mark(r);
    kvr_tenants *fresh = NULL;
    kvl_status s = kvr_auth_load(r->cfg, &fresh);
    if (s) return s;
    int n = kvr_tenants_count(fresh), k = kvr_tenants_key_count(fresh);
    kvr_tenants_replace(r->tenants, fresh);
    kvr_auth_declare(r);
    kvl__svc_log_text("info", "reloaded %s: %d tenants, %d keys", r->cfg->api_keys, n, k);
    return KVL_OK;
}

void kvr_auth_refused(kvr_router *r, const char *reason) {
    char lab[48];
    snprintf(lab, sizeof lab, "reason=\"%s\"", reason);
    kvr_metrics_inc(r->metrics, "kvlingo_router_auth_refused_total", lab, 1);
}

void kvr_quota_refused(kvr_router *r, const char *tenant, const char *quota) {
    char lab[160], q[140];
    kvl__svc_prom_label_value(q, sizeof q, tenant);
    snprintf(lab, sizeof lab, "tenant=\"%s\",quota=\"%s\"", q, quota);
    kvr_metrics_inc(r->metrics, "kvlingo_router_quota_refused_total", lab, 1);
}

int kvr_auth_value(kvr_router *r, const char *value, int need_admin, kvr_tenant_info *out,
                   const char **reason) {
    *reason = NULL;
    if (kvr_tenants_open(r->tenants)) {
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "%s", KVR_DEFAULT_TENANT);
        out->admin = 1;
        return KVR_AUTH_OK;
    }
    int f = kvr_tenants_authorize(r->tenants, value, out);
    int rc = f < 0 ? KVR_AUTH_MISSING : f == 0 ? KVR_AUTH_UNKNOWN
           : need_admin && !out->admin ? KVR_AUTH_FORBIDDEN : KVR_AUTH_OK;
    if (rc != KVR_AUTH_OK) {
        *reason = k_reasons[rc - 1];
        kvr_auth_refused(r, *reason);
    }
    return rc;
}

int kvr_auth_call(kvr_router *r, kvl__rpc_call *call, const char *method, int need_admin,
                  kvr_tenant_info *out) {
    char v[KVR_KEY_MAX + 32];
    size_t n = kvl__rpc_call_metadata(call, "authorization", v, sizeof v);
    const char *reason = NULL;
    /* a value longer than any key is an unknown key, not a missing one */
    int rc = kvr_auth_value(r, n == SIZE_MAX ? "Bearer -" : n ? v : NULL, need_admin, out, &reason);
    if (rc == KVR_AUTH_OK) return 0;
    grpc_status_code code = rc == KVR_AUTH_FORBIDDEN ? GRPC_STATUS_PERMISSION_DENIED : GRPC_STATUS_UNAUTHENTICATED;
    const char *msg = rc == KVR_AUTH_MISSING ? "no API key: send metadata 'authorization: Bearer KEY'"
                    : rc == KVR_AUTH_UNKNOWN ? "unknown API key"
                                             : "this API key's tenant may not call this method (admin only)";
    kvl__svc_log_text("warn", "%s -> %s: %s (peer %s)", method, kvl__rpc_status_name(code), msg,
                      kvl__rpc_call_peer(call));
    char lab[48];
    snprintf(lab, sizeof lab, "code=\"%s\"", kvl__rpc_status_name(code));
    kvr_metrics_inc(r->metrics, "kvlingo_router_errors_total", lab, 1);
    kvl__rpc_call_finish(call, code, "%s", msg);
    return -1;
}
