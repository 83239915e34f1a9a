/* daemon/peers.h: the fleet's other nodes (--peers HOST:PORT,...), connected at start and again
 * when SIGHUP reloads the list. */
#ifndef KVLD_PEERS_H
#define KVLD_PEERS_H

#include "kvlingo/status.h"

#define KVLD_MAX_PEERS 64            /* entries of --peers                              */
#define KVLD_PEER_ADDR_MAX 256       /* bytes of one "host:port", NUL included           */
#define KVLD_PEER_GIVE_UP_S 300.0    /* stop retrying a peer that never answered          */
#define KVLD_PEER_REFRESH_S 10.0     /* a connected member's Info is asked again this often */

struct kvld_node;

/* Split "host:port,host:port" (commas and/or spaces) into out[max]; KVL_ERR_INVALID_ARG naming
 * the entry when one is not HOST:PORT, too long, or there are more than max. */
kvl_status kvld_peers_parse(const char *list, char (*out)[KVLD_PEER_ADDR_MAX], int max, int *n);

/* Start the background thread that connects every configured peer (no-op without --peers);
 * kvld_peers_stop ends it (waits at most about one Info deadline). */
kvl_status kvld_peers_start(struct kvld_node *n);
void kvld_peers_stop(struct kvld_node *n);

/* A call from a node that may be a fleet member (its Info call on connecting): while some
 * configured peer is not connected yet, the connecting thread retries now instead of at the
 * end of its back-off, so the node that started first connects the one that started second
 * as soon as the second has connected it (retries at most every 50 ms, however many calls). */
void kvld_peers_kick(struct kvld_node *n);

/* A membership change: `list` ("host:port,...") becomes the fleet spans may go to, and the
 * connecting thread starts again on it (members already connected are quick: their channel
 * and endpoint are kept; a member that left is refused from now on, peer_not_member).  A list
 * that does not parse leaves everything as it was (KVL_ERR_INVALID_ARG naming the entry). */
kvl_status kvld_peers_reload(struct kvld_node *n, const char *list);

#endif
