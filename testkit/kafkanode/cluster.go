package kafkanode

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/playpipe/playpipe/internal/loopport"
)

// Config says what cluster to start.
type Config struct {
	// Dir is the parent folder of the nodes' folders (node-1, node-2, …).
	Dir string
	// Nodes is the number of combined broker+controller nodes; 0 means 1.
	// Past one node the internal topics are replicated three ways (or as
	// many as there are nodes) and min.insync.replicas is 2.
	Nodes int
	// Controllers is a number of dedicated controller-only nodes that join
	// the quorum of the combined nodes (ids after theirs). With 2 beside 3
	// combined nodes the quorum survives two combined nodes down, so the
	// brokers left can shrink their in-sync replicas and refuse writes with
	// NOT_ENOUGH_REPLICAS instead of stalling without a controller.
	Controllers int
	// Install is the release to run (FindInstall).
	Install Install
	// Heap is each JVM's -Xmx; empty means 512m.
	Heap string
	// Props are broker settings added to, or replacing, the defaults of
	// ServerProps.
	Props map[string]string
	// Addr returns a free loopback host:port for a listener; nil picks one
	// with the kernel (net.Listen on port 0).
	Addr func() (string, error)
	// NodeAddr, when set, returns the host:port of a listener of node id
	// instead of Addr: for a node that lives on another address (a
	// network namespace's, see Prefix).
	NodeAddr func(id int) (string, error)
	// Prefix, by node id, is a command the node's JVM is run under, e.g.
	// {"ip", "netns", "exec", "NAME"} to put it in a network namespace; the
	// command must exec the JVM (its PID is the node's).
	Prefix map[int][]string
	// ReadyTimeout bounds the wait until every broker is registered; 0
	// means two minutes.
	ReadyTimeout time.Duration
}

// Cluster is a running set of KRaft nodes.
type Cluster struct {
	ID    string // the cluster id the storage was formatted with
	nodes []*Node
	cfg   Config
}

// StartError is a start that failed: why, and the tail of each node's log.
type StartError struct {
	Err   error
	Tails map[int]string // node id → its log's last lines
}

func (e *StartError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafkanode: Apache Kafka did not start: %v", e.Err)
	for _, id := range sortedKeys(e.Tails) {
		fmt.Fprintf(&b, "\n--- node %d log (last lines) ---\n%s", id, e.Tails[id])
	}
	return b.String()
}

func (e *StartError) Unwrap() error { return e.Err }

// Start writes each node's settings, formats its storage, starts the JVMs
// and waits until the admin API lists every broker. On failure every node is
// killed and the error carries their log tails.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Nodes <= 0 {
		cfg.Nodes = 1
	}
	if cfg.Heap == "" {
		cfg.Heap = "512m"
	}
	if cfg.Addr == nil {
		cfg.Addr = loopport.Addr // below the ephemeral range: a node restarted on it finds it free
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 2 * time.Minute
	}
	c := &Cluster{ID: newClusterID(), cfg: cfg}
	addr := func(id int) (string, error) {
		if cfg.NodeAddr != nil {
			return cfg.NodeAddr(id)
		}
		return cfg.Addr()
	}
	for i := 1; i <= cfg.Nodes; i++ {
		b, err := addr(i)
		if err != nil {
			return nil, fmt.Errorf("kafkanode: a port for node %d: %w", i, err)
		}
		ctl, err := addr(i)
		if err != nil {
			return nil, fmt.Errorf("kafkanode: a port for node %d: %w", i, err)
		}
		c.nodes = append(c.nodes, &Node{ID: i, Broker: b, Controller: ctl, dir: filepath.Join(cfg.Dir, "node-"+strconv.Itoa(i)), install: cfg.Install, heap: cfg.Heap, prefix: cfg.Prefix[i]})
	}
	for i := cfg.Nodes + 1; i <= cfg.Nodes+cfg.Controllers; i++ {
		ctl, err := addr(i)
		if err != nil {
			return nil, fmt.Errorf("kafkanode: a port for controller %d: %w", i, err)
		}
		c.nodes = append(c.nodes, &Node{ID: i, Controller: ctl, dir: filepath.Join(cfg.Dir, "controller-"+strconv.Itoa(i)), install: cfg.Install, heap: "256m", prefix: cfg.Prefix[i]})
	}
	fail := func(err error) (*Cluster, error) {
		c.Close()
		return nil, &StartError{Err: err, Tails: c.tails()}
	}
	for _, n := range c.nodes {
		if err := n.format(ctx, c.ID, c.ServerProps(n)); err != nil {
			return fail(err)
		}
	}
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			return fail(err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	if err := c.waitBrokers(rctx, c.Brokers()...); err != nil {
		return fail(err)
	}
	return c, nil
}

// ServerProps are node n's broker settings: a combined node in a static
// controller quorum of every node, PLAINTEXT on loopback, replication of the
// internal topics and min.insync.replicas as the cluster's size allows, then
// Config.Props. Broker defaults are kept otherwise (the group's initial
// rebalance delay, session timeouts, offset.metadata.max.bytes), except
// that the internal topics have 6 partitions instead of 50: the first group
// and the first transaction come up in a second instead of several on a
// small machine, with no change in what a client sees.
func (c *Cluster) ServerProps(n *Node) map[string]string {
	var voters []string
	for _, m := range c.nodes {
		voters = append(voters, fmt.Sprintf("%d@%s", m.ID, m.Controller))
	}
	brokers := len(c.Brokers())
	rf := strconv.Itoa(min(3, brokers))
	isr := strconv.Itoa(min(2, brokers))
	if n.Broker == "" {
		// min.insync.replicas on the controllers too: the active controller
		// decides the ISR and the eligible leader replicas (KIP-966) by its
		// own view of it, and a controller-only node left at the default (1)
		// let the leader acknowledge acks=all writes with the ISR at the
		// leader alone when it was the active one (TestApacheKafkaCluster,
		// two CI rehearsals).
		return map[string]string{
			"process.roles":                  "controller",
			"node.id":                        strconv.Itoa(n.ID),
			"controller.quorum.voters":       strings.Join(voters, ","),
			"listeners":                      "CONTROLLER://" + n.Controller,
			"controller.listener.names":      "CONTROLLER",
			"listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
			"log.dirs":                       filepath.Join(n.dir, "data"),
			"min.insync.replicas":            isr,
		}
	}
	p := map[string]string{
		"process.roles":                            "broker,controller",
		"node.id":                                  strconv.Itoa(n.ID),
		"controller.quorum.voters":                 strings.Join(voters, ","),
		"listeners":                                "PLAINTEXT://" + n.Broker + ",CONTROLLER://" + n.Controller,
		"advertised.listeners":                     "PLAINTEXT://" + n.Broker,
		"controller.listener.names":                "CONTROLLER",
		"inter.broker.listener.name":               "PLAINTEXT",
		"listener.security.protocol.map":           "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"log.dirs":                                 filepath.Join(n.dir, "data"),
		"offsets.topic.replication.factor":         rf,
		"offsets.topic.num.partitions":             "6",
		"transaction.state.log.replication.factor": rf,
		"transaction.state.log.min.isr":            isr,
		"transaction.state.log.num.partitions":     "6",
		"default.replication.factor":               rf,
		"min.insync.replicas":                      isr,
	}
	if c.cfg.Install.Major() >= 4 {
		p["share.coordinator.state.topic.replication.factor"] = rf
		p["share.coordinator.state.topic.min.isr"] = isr
	}
	for k, v := range c.cfg.Props {
		p[k] = v
	}
	return p
}

// Nodes returns every node, node id 1 first.
func (c *Cluster) Nodes() []*Node { return slices.Clone(c.nodes) }

// Brokers returns the nodes that are brokers (all but the controller-only
// ones).
func (c *Cluster) Brokers() []*Node {
	var out []*Node
	for _, n := range c.nodes {
		if n.Broker != "" {
			out = append(out, n)
		}
	}
	return out
}

// Node returns the node with the given id, nil if none.
func (c *Cluster) Node(id int) *Node {
	for _, n := range c.nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// Addrs returns every node's broker listener, host:port.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, n := range c.Brokers() {
		out = append(out, n.Broker)
	}
	return out
}

// Version is the running release.
func (c *Cluster) Version() string { return c.cfg.Install.Version }

// Restart starts a stopped or killed node again on its folder and ports
// and waits until it is registered and answers on its own listener (a
// controller-only node: until its process is up).
func (c *Cluster) Restart(ctx context.Context, n *Node) error {
	if err := n.start(); err != nil {
		return err
	}
	if n.Broker == "" {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	if err := c.waitBrokers(rctx, n); err != nil {
		return &StartError{Err: err, Tails: map[int]string{n.ID: n.LogTail(4096)}}
	}
	return nil
}

// Close kills every node. Safe to call twice.
func (c *Cluster) Close() {
	for _, n := range c.nodes {
		n.Kill()
	}
}

// ActiveController returns the id of the KRaft quorum's leader (the
// active controller), asked of any live broker (DescribeQuorum).
func (c *Cluster) ActiveController(ctx context.Context) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.DialTimeout(2*time.Second))
	if err != nil {
		return 0, fmt.Errorf("kafkanode: client: %w", err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDescribeQuorumRequest()
	t := kmsg.NewDescribeQuorumRequestTopic()
	t.Topic = "__cluster_metadata"
	p := kmsg.NewDescribeQuorumRequestTopicPartition()
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("kafkanode: describe quorum: %w", err)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.LeaderID >= 0 {
				return int(p.LeaderID), nil
			}
		}
	}
	return 0, fmt.Errorf("kafkanode: describe quorum: no leader in %d topics", len(resp.Topics))
}

// waitBrokers waits until each of nodes answers on its own listener and
// the cluster's metadata lists it, or one of them exits.
func (c *Cluster) waitBrokers(ctx context.Context, nodes ...*Node) error {
	for _, n := range nodes {
		if err := waitBroker(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

func waitBroker(ctx context.Context, n *Node) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(n.Broker), kgo.DialTimeout(time.Second), kgo.RetryTimeout(time.Second))
	if err != nil {
		return fmt.Errorf("kafkanode: client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var last error
	for {
		select {
		case <-n.exitedCh():
			return fmt.Errorf("node %d (broker %s) exited during start", n.ID, n.Broker)
		default:
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		md, err := adm.BrokerMetadata(actx)
		cancel()
		if err == nil && slices.ContainsFunc(md.Brokers, func(b kadm.BrokerDetail) bool { return int(b.NodeID) == n.ID }) {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("metadata lists brokers %v, not yet node %d", md.Brokers.NodeIDs(), n.ID)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d (broker %s) not ready: %w (last: %v)", n.ID, n.Broker, ctx.Err(), last)
		case <-n.exitedCh():
			return fmt.Errorf("node %d (broker %s) exited during start", n.ID, n.Broker)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *Cluster) tails() map[int]string {
	out := map[int]string{}
	for _, n := range c.nodes {
		out[n.ID] = n.LogTail(3000)
	}
	return out
}

// newClusterID is a random cluster id in the form Kafka's storage tool
// prints (a UUID in URL-safe base64, 22 characters).
func newClusterID() string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:])
		if id := base64.RawURLEncoding.EncodeToString(b[:]); id[0] != '-' { // never read as a flag
			return id
		}
	}
}

func sortedKeys[K interface{ ~int | ~string }, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
