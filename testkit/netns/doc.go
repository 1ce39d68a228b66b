// Package netns gives one Apache Kafka node a network of its own so that a
// test or a chaos run can cut it off: a network namespace holding the node,
// reached from the host through a veth pair (a /30 of 10.<Subnet>.x.0), the
// other nodes listening on the host end's address. Cut drops every packet
// in and out of the namespace with an nftables table whose chains have
// policy drop, silently (no RST, no ICMP), as a real partition does; Heal
// deletes the table.
//
// Setup needs root, ip (iproute2) and nft (nftables); where any is missing it
// returns no namespace and a reason to print, and the caller runs every node
// on loopback instead. Names carry the process id, so concurrent runs do not
// collide. Close removes the veth pair and the namespace; call it after the
// node in it has been stopped.
//
// Users: the cluster test in e2e (kafkacluster_test.go) and tools/chaos,
// through kafkanode.Config's NodeAddr and Prefix (Addr and Exec).
package netns
