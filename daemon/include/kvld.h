/* daemon/include/kvld.h: kvld's interface for in-process use, the one daemon header that code
 * outside daemon/ (benches, tests) may include.  It gives:
 *   sessions   the session table: open, look up, cache bytes (session.h)
 *   scheduler  batched prefill/decode over the sessions, on its own thread (a job's first
 *              step on an idle node on the submitting thread; scheduler.h)
 *   metrics    kvld's Prometheus series and their exposition text (metrics.h)
 * Each declaration documents its ownership, units and errors where it is declared.  The other
 * daemon headers (config, node, translators) are private to daemon/; this folder is the only
 * include directory kvl_daemon exports. */
#ifndef KVLD_H
#define KVLD_H

#include "../metrics.h"
#include "../scheduler.h"
#include "../session.h"

#endif
