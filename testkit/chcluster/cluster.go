package chcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/internal/chlocal"
)

// Config configures a cluster. Zero values take the defaults named.
type Config struct {
	// Dir holds ZooKeeper's folder (zookeeper/) and one data folder per
	// replica (r1/, r2/, …). Required.
	Dir string
	// Name is the cluster's name in remote_servers; defaults to "ledger".
	Name string
	// Replicas is the number of replicas of the one shard; defaults to 2.
	Replicas int
	// Binary is the ClickHouse server binary; defaults to chlocal's choice.
	Binary string
	// ZooKeeperJar defaults to ZooKeeperJar (Debian's).
	ZooKeeperJar string
	// SessionTimeout is the replicas' ZooKeeper session timeout; defaults to
	// 8 s (ZooKeeper here grants 1–10 s). A killed replica's old session,
	// and with it its "active" mark, lives that long after the kill: the
	// restarted replica resumes replication only then.
	SessionTimeout time.Duration
	// StartTimeout bounds each process's start; defaults to 60 s.
	StartTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Cluster is ZooKeeper plus the replicas of one shard, each a local
// clickhouse-server.
type Cluster struct {
	cfg      Config
	zk       *ZooKeeper
	replicas []*chlocal.Server
}

// Shard is the value of every replica's {shard} macro.
const Shard = "01"

// ReplicaName is the {replica} macro of replica i (0-based): r1, r2, ….
func ReplicaName(i int) string { return "r" + strconv.Itoa(i+1) }

// Start starts ZooKeeper, waits until it serves, then starts the replicas
// (ports chosen first, since each configuration names them all) and waits
// until system.zookeeper answers on every one. On error what was started
// is stopped.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Dir == "" {
		return nil, errors.New("chcluster: Config.Dir is required")
	}
	if cfg.Name == "" {
		cfg.Name = "ledger"
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 2
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 8 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Binary == "" {
		b, err := chlocal.FindBinary()
		if err != nil {
			return nil, err
		}
		cfg.Binary = b.Path
	}
	c := &Cluster{cfg: cfg}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	began := time.Now()
	if c.zk, err = startZooKeeper(ctx, filepath.Join(cfg.Dir, "zookeeper"), cfg.ZooKeeperJar, cfg.StartTimeout); err != nil {
		return nil, err
	}
	zkAfter := time.Since(began)
	type ports struct{ tcp, http, inter int }
	all := make([]ports, cfg.Replicas)
	seen := map[int]bool{}
	for i := range all {
		for _, p := range []*int{&all[i].tcp, &all[i].http, &all[i].inter} {
			for *p == 0 || seen[*p] {
				if *p, err = freePort(); err != nil {
					return nil, err
				}
			}
			seen[*p] = true
		}
	}
	var shard strings.Builder
	for _, p := range all {
		shard.WriteString("\n                <replica><host>127.0.0.1</host><port>" + strconv.Itoa(p.tcp) + "</port></replica>")
	}
	for i, p := range all {
		dir := filepath.Join(cfg.Dir, ReplicaName(i))
		if err := os.MkdirAll(filepath.Join(dir, "config.d"), 0o755); err != nil {
			return nil, fmt.Errorf("chcluster: %w", err)
		}
		xml := `<?xml version="1.0"?>
<!-- Written by playpipe (testkit/chcluster): replica ` + ReplicaName(i) + ` of cluster ` + cfg.Name + `. -->
<yandex>
    <remote_servers>
        <` + cfg.Name + `>
            <shard>
                <internal_replication>true</internal_replication>` + shard.String() + `
            </shard>
        </` + cfg.Name + `>
    </remote_servers>
    <macros>
        <shard>` + Shard + `</shard>
        <replica>` + ReplicaName(i) + `</replica>
    </macros>
    <zookeeper>
        <node><host>127.0.0.1</host><port>` + strconv.Itoa(c.zk.Port()) + `</port></node>
        <session_timeout_ms>` + strconv.FormatInt(cfg.SessionTimeout.Milliseconds(), 10) + `</session_timeout_ms>
    </zookeeper>
    <distributed_ddl>
        <path>/clickhouse/task_queue/ddl</path>
    </distributed_ddl>
    <interserver_http_host>127.0.0.1</interserver_http_host>
    <interserver_http_port>` + strconv.Itoa(p.inter) + `</interserver_http_port>
</yandex>
`
		if err := os.WriteFile(filepath.Join(dir, "config.d", "cluster.xml"), []byte(xml), 0o644); err != nil {
			return nil, fmt.Errorf("chcluster: %w", err)
		}
		s, err := chlocal.Start(ctx, chlocal.Config{Dir: dir, Binary: cfg.Binary, StartTimeout: cfg.StartTimeout,
			Logger: cfg.Logger, TCPPort: p.tcp, HTTPPort: p.http})
		if s != nil && err == nil {
			c.replicas = append(c.replicas, s)
		}
		if err != nil {
			return nil, fmt.Errorf("chcluster: replica %s: %w", ReplicaName(i), err)
		}
	}
	for i := range c.replicas {
		if err := c.waitZooKeeper(ctx, i); err != nil {
			return nil, err
		}
	}
	if err := c.probeDDL(ctx); err != nil {
		return nil, err
	}
	cfg.Logger.Info("chcluster: replicated ClickHouse started", "cluster", cfg.Name, "zookeeper", c.zk.Addr(),
		"replicas", c.Addrs(), "zookeeper_serving_after", zkAfter.Round(time.Millisecond), "took", time.Since(began).Round(time.Millisecond))
	return c, nil
}

// Name is the cluster's name (--clickhouse-cluster).
func (c *Cluster) Name() string { return c.cfg.Name }

// ZooKeeper is the cluster's ZooKeeper.
func (c *Cluster) ZooKeeper() *ZooKeeper { return c.zk }

// Addrs are the replicas' native addresses, in replica order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.replicas))
	for i, s := range c.replicas {
		out[i] = s.Addr()
	}
	return out
}

// Replica is the server of replica i (0-based).
func (c *Cluster) Replica(i int) *chlocal.Server { return c.replicas[i] }

// Kill stops replica i with SIGKILL (a crash); its data survives.
func (c *Cluster) Kill(i int) { c.replicas[i].Kill() }

// Restart starts a stopped or killed replica i again on its ports and data
// and waits until system.zookeeper answers on it. Replication resumes
// once the session of the killed process has expired (SessionTimeout).
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.replicas[i].Start(ctx); err != nil {
		return fmt.Errorf("chcluster: restart replica %s: %w", ReplicaName(i), err)
	}
	return c.waitZooKeeper(ctx, i)
}

// waitZooKeeper polls system.zookeeper on replica i until it answers.
func (c *Cluster) waitZooKeeper(ctx context.Context, i int) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	conn, err := c.dial(i)
	if err != nil {
		return err
	}
	defer conn.Close()
	var last error
	for {
		var n uint64
		qctx, qcancel := context.WithTimeout(ctx, 3*time.Second)
		last = conn.QueryRow(qctx, "SELECT count() FROM system.zookeeper WHERE path = '/'").Scan(&n)
		qcancel()
		if last == nil && n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chcluster: replica %s (%s): system.zookeeper did not answer: %w (last: %v)", ReplicaName(i), c.replicas[i].Addr(), ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// dial opens a connection to replica i alone.
func (c *Cluster) dial(i int) (driver.Conn, error) {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.replicas[i].Addr()}, DialTimeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("chcluster: replica %s: %w", ReplicaName(i), err)
	}
	return conn, nil
}

// probeDDL runs one distributed DDL statement that changes nothing (DROP
// DATABASE IF EXISTS ON CLUSTER) and waits for every replica to finish it:
// the servers answer queries and ZooKeeper before their DDL workers have
// read the queue, and a DDL worker that stopped (18.16's "Terminating.
// Cannot initialize DDL queue", or an unexpected error) leaves every ON
// CLUSTER statement waiting for distributed_ddl_task_timeout (180 s) with
// no word why. A failure here says so, with each replica's error log.
func (c *Cluster) probeDDL(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	conn, err := c.dial(0)
	if err != nil {
		return err
	}
	defer conn.Close()
	secs := int(c.cfg.StartTimeout / time.Second)
	if secs < 1 {
		secs = 1
	}
	qctx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"distributed_ddl_task_timeout": secs}))
	if err := conn.Exec(qctx, "DROP DATABASE IF EXISTS chcluster_probe ON CLUSTER "+c.cfg.Name); err != nil {
		var logs strings.Builder
		for i, s := range c.replicas {
			fmt.Fprintf(&logs, "\n--- replica %s error log:\n%s", ReplicaName(i), s.LogTail())
		}
		return fmt.Errorf("chcluster: the replicas' distributed DDL queue did not run a probe statement: %w%s", err, logs.String())
	}
	return nil
}

// Close kills the replicas and ZooKeeper (throwaway data: no orderly
// shutdown).
func (c *Cluster) Close() {
	for _, s := range c.replicas {
		s.Kill()
	}
	if c.zk != nil {
		c.zk.Kill()
	}
}
