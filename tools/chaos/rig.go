//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/chlocal"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/loopport"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/testkit/kafkanode"
	"github.com/playpipe/playpipe/testkit/netns"
	"github.com/playpipe/playpipe/testkit/testenv"
	"github.com/playpipe/playpipe/testkit/tlsedge"
)

// The rig's fixed shape.
const (
	partitions = 6
	database   = "playpipe_chaos"
	// The sandbox's catalog: 8 mixes, as in the e2e cluster suite.
	sbSeed, sbPages, sbLists, sbMixes = 5, 1, 2, 4
	fleetKey                          = "pp_key_chaos_fleet_0123456789"
	// apiTimeout is the reporters' --api-timeout: a report held longer
	// is a timeout.
	apiTimeout = 5 * time.Second
)

// Rig is every process of a run.
type Rig struct {
	dir, bin string
	log      *slog.Logger
	net      *netns.Namespace // nil: every node on loopback, no partition

	kafka   *kafkanode.Cluster
	kcfg    kafkax.Config
	ch      *chlocal.Server
	chAddr  string
	sbProc  *exec.Cmd
	sbAPI   string         // the sandbox's own API address (http)
	sbAdmin string         // its admin API (host:port)
	edge    *tlsedge.Nginx // the partner's edge in front of sbAPI
	edgeCA  string         // its CA (SSL_CERT_FILE for the roles)
	cat     *sandbox.Catalog
	ingest  string // gateway address
	super   *Super
}

// startRig starts Apache Kafka (3 nodes, node 3 in a network namespace when
// one can be made), ClickHouse, the sandbox behind nginx, and the roles.
func startRig(ctx context.Context, dir, bin string, heap string, log *slog.Logger) (*Rig, error) {
	r := &Rig{dir: dir, bin: bin, log: log}
	for _, d := range []string{"logs", "kafka", "clickhouse", "nginx"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return r, err
		}
	}
	in, err := kafkanode.FindInstall(os.Getenv("PLAYPIPE_KAFKA_VERSION"))
	if err != nil {
		return r, err
	}
	cfg := kafkanode.Config{Dir: filepath.Join(dir, "kafka"), Nodes: 3, Install: in, Heap: heap} // Addr: loopport.Addr, its default
	if n, why := netns.Setup(netns.Spec{Prefix: "ppch", Subnet: 232, Table: "ppchaos_partition", Node: 3}); n != nil {
		r.net = n
		cfg.NodeAddr, cfg.Prefix = n.Addr, map[int][]string{n.Node: n.Exec()}
		log.Info("chaos: node 3 in a network namespace", "ns", n.Name, "addr", n.NSIP)
	} else {
		log.Warn("chaos: no network namespace: every node on loopback, no partition fault", "why", why)
	}
	began := time.Now()
	if r.kafka, err = kafkanode.Start(ctx, cfg); err != nil {
		return r, err
	}
	r.kcfg = kafkax.Config{Brokers: r.kafka.Addrs(), TopicPrefix: kafkax.DefaultTopicPrefix, Partitions: partitions, ReplicationFactor: 3}
	if err := kafkax.EnsureTopics(ctx, r.kcfg); err != nil {
		return r, fmt.Errorf("topics: %w", err)
	}
	log.Info("chaos: Apache Kafka ready", "version", in.Version, "brokers", r.kafka.Addrs(), "took", time.Since(began).Round(time.Millisecond))

	if r.ch, err = chlocal.Start(ctx, chlocal.Config{Dir: chDir(dir), Logger: log}); err != nil {
		return r, err
	}
	r.chAddr = r.ch.Addr()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{r.chAddr}, DialTimeout: 5 * time.Second})
	if err != nil {
		return r, fmt.Errorf("clickhouse: %w", err)
	}
	err = conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+database)
	conn.Close()
	if err != nil {
		return r, fmt.Errorf("clickhouse: create database: %w", err)
	}

	if err := r.startSandbox(ctx); err != nil {
		return r, err
	}
	srv, err := sandbox.New(sandbox.Config{Seed: sbSeed, Pages: sbPages, ListsPerPage: sbLists, MixesPerList: sbMixes})
	if err != nil {
		return r, fmt.Errorf("sandbox catalog: %w", err)
	}
	r.cat = srv.Catalog()
	if err := r.startEdge(filepath.Join(dir, "nginx")); err != nil {
		return r, err
	}
	r.startRoles()
	return r, nil
}

// chDir is ClickHouse's data folder: in RAM (/dev/shm) when it exists,
// as testenv does (every insert is a part of a few dozen files).
func chDir(dir string) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "playpipe-chaos-ch-"); err == nil {
			return d
		}
	}
	return filepath.Join(dir, "clickhouse")
}

// startEdge starts nginx with TLS on a loopback port in front of the
// sandbox, with a CA of the run's own, as e2e/edge runs it.
func (r *Rig) startEdge(dir string) error {
	certs, err := tlsedge.WriteCerts(dir)
	if err != nil {
		return err
	}
	r.edgeCA = certs.CAFile
	r.edge, err = tlsedge.Start(tlsedge.Config{
		Dir: dir, Upstream: r.sbAPI, Certs: certs, Addr: loopport.Addr,
		Location: "proxy_read_timeout 120s;",
	})
	return err
}

func (r *Rig) startSandbox(ctx context.Context) error {
	r.sbAPI, r.sbAdmin = mustAddr(), mustAddr()
	f, err := os.Create(filepath.Join(r.dir, "logs", "sandbox.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, "sandbox", "--addr", r.sbAPI, "--admin-addr", r.sbAdmin, "--seed", fmt.Sprint(sbSeed),
		"--pages", fmt.Sprint(sbPages), "--lists-per-page", fmt.Sprint(sbLists), "--mixes-per-list", fmt.Sprint(sbMixes))
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("sandbox: %w", err)
	}
	r.sbProc = cmd
	go func() { _ = cmd.Wait(); f.Close() }() // owned by the rig: Close kills it
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + r.sbAdmin + "/admin/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("sandbox not up on %s: %v", r.sbAdmin, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startRoles starts sink, ingest, consume ×2, report ×2 (report-2 is the
// scale-out's, not started) under the supervisor.
func (r *Rig) startRoles() {
	env := testenv.ChildEnv("PLAYPIPE_API_CLIENT_ID="+sandbox.DefaultClientID, "PLAYPIPE_API_CLIENT_SIGNATURE="+sandbox.DefaultClientSignature,
		"PLAYPIPE_LOG_LEVEL=info", "SSL_CERT_FILE="+r.edgeCA)
	r.super = newSuper(r.bin, filepath.Join(r.dir, "logs"), env, r.log)
	kafkaArgs := []string{"--brokers", strings.Join(r.kafka.Addrs(), ","), "--partitions", fmt.Sprint(partitions), "--replication-factor", "3"}
	chArgs := []string{"--clickhouse-addr", r.chAddr, "--clickhouse-db", database}
	api := "https://" + r.edge.Addr()
	r.ingest = mustAddr()
	role := func(name, progress string, args ...string) *Role {
		return &Role{Name: name, Args: args, Admin: mustAddr(), Progress: progress}
	}
	r.super.Add(role("sink", "playpipe_sink_rows_total", append(append([]string{"sink"}, kafkaArgs...), append(chArgs, "--instance-id", "chaos-sink")...)...), true)
	r.super.Add(role("ingest", "playpipe_events_accepted_total", append(append([]string{"ingest"}, kafkaArgs...),
		"--api-key", "fleet:"+gateway.HashKey(fleetKey), "--addr", r.ingest, "--delivery-timeout", "5s", "--shutdown-timeout", "10s")...), true)
	for i := range 2 {
		r.super.Add(role(fmt.Sprintf("consume-%d", i), "playpipe_events_in_total", append(append([]string{"consume"}, kafkaArgs...),
			"--api-url", api, "--instance-id", fmt.Sprintf("chaos-consume-%d", i), "--transactional-id", fmt.Sprintf("chaos-enrich-%d", i))...), true)
	}
	for i := range 3 {
		r.super.Add(role(fmt.Sprintf("report-%d", i), "playpipe_deliveries_total", append(append([]string{"report"}, kafkaArgs...),
			"--api-url", api, "--instance-id", fmt.Sprintf("chaos-report-%d", i), "--api-timeout", apiTimeout.String(),
			"--backoff-max", "2s", "--park-after", "30s", "--park-after-attempts", "12")...), i < 2)
	}
	r.super.others["sandbox"] = func() int { return r.sbProc.Process.Pid }
	r.super.others["clickhouse"] = r.ch.PID
	for _, n := range r.kafka.Nodes() {
		r.super.others[fmt.Sprintf("kafka-node-%d", n.ID)] = n.PID
	}
	r.super.Run()
}

// waitReady waits until every role that should run answers /readyz 200.
func (r *Rig) waitReady(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		nr := r.super.NotReady()
		if len(nr) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("roles not ready within %s: %v", d, nr)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// client is a Kafka client of the cluster.
func (r *Rig) client() (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(r.kafka.Addrs()...), kgo.DialTimeout(2*time.Second))
}

// busiestLeader is the broker leading the most partitions of plays.reports.
func (r *Rig) busiestLeader(ctx context.Context) (int, error) {
	cl, err := r.client()
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, r.kcfg.Topics().Reports)
	if err != nil {
		return 0, err
	}
	count := map[int32]int{}
	best, bestN := int32(-1), -1
	for _, t := range td.Sorted() {
		for _, p := range t.Partitions.Sorted() {
			count[p.Leader]++
			if p.Leader >= 0 && count[p.Leader] > bestN {
				best, bestN = p.Leader, count[p.Leader]
			}
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("no leader of %s", r.kcfg.Topics().Reports)
	}
	return int(best), nil
}

// Close stops the roles, the fleet's far ends and the cluster, and removes
// the data folders (logs and the timeline stay).
func (r *Rig) Close() {
	if r.super != nil {
		r.super.Close()
	}
	if r.edge != nil {
		r.edge.Kill()
	}
	if r.sbProc != nil && r.sbProc.Process != nil {
		_ = r.sbProc.Process.Kill()
	}
	if r.ch != nil {
		_ = syscall.Kill(r.ch.PID(), syscall.SIGCONT)
		r.ch.Kill()
		if strings.HasPrefix(r.ch.Dir(), "/dev/shm/") {
			_ = os.RemoveAll(r.ch.Dir())
		}
	}
	if r.kafka != nil {
		r.kafka.Close()
	}
	if r.net != nil {
		r.net.Close()
	}
}

// mustAddr is a free 127.0.0.1 port below the ephemeral range
// (internal/loopport), as the brokers' and nginx's are. Every listener here is killed and restarted on its
// port during the run: an ephemeral port ("127.0.0.1:0") can be taken by
// any outgoing connection the moment its owner dies, and the restart then
// fails with "address already in use" for as long as that connection lives
// (a CI run: the sink's admin port taken while it was down, 123 restarts
// that each exited at once, report-0 likewise and left dead).
func mustAddr() string {
	a, err := loopport.Addr()
	if err != nil {
		panic(fmt.Sprintf("chaos: no free port: %v", err))
	}
	return a
}
