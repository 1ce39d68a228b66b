package chcluster

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/playpipe/playpipe/internal/chlocal"
)

// TestMissingZooKeeper: without ZooKeeper's jar Start says so with
// ErrZooKeeperNotInstalled (testenv skips on it, or fails under
// PLAYPIPE_REQUIRE_CLICKHOUSE=1) and leaves nothing running.
func TestMissingZooKeeper(t *testing.T) {
	if _, err := chlocal.FindBinary(); err != nil {
		t.Skipf("no ClickHouse: %v", err)
	}
	_, err := Start(context.Background(), Config{Dir: t.TempDir(), ZooKeeperJar: "/nonexistent/zookeeper.jar"})
	if !errors.Is(err, ErrZooKeeperNotInstalled) || !strings.Contains(err.Error(), "apt-get install zookeeper") {
		t.Fatalf("err = %v, want ErrZooKeeperNotInstalled naming the package", err)
	}
}

// TestClusterStartKillRestart: the replicas come up configured as one
// shard of two replicas with their macros, an ON CLUSTER statement runs on
// both, and a replica killed with SIGKILL is back (system.zookeeper
// answers) after Restart.
func TestClusterStartKillRestart(t *testing.T) {
	if _, err := os.Stat(ZooKeeperJar); err != nil && os.Getenv("PLAYPIPE_REQUIRE_CLICKHOUSE") != "1" {
		t.Skipf("no ZooKeeper: %v", err)
	}
	if _, err := chlocal.FindBinary(); err != nil && os.Getenv("PLAYPIPE_REQUIRE_CLICKHOUSE") != "1" {
		t.Skipf("no ClickHouse: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	c, err := Start(ctx, Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("ZooKeeper and 2 replicas serving in %s", time.Since(began).Round(time.Millisecond))
	if ans, err := c.ZooKeeper().FourLetter(ctx, "srvr"); err != nil || !strings.Contains(ans, "Mode: standalone") {
		t.Fatalf("srvr: %q, %v", ans, err)
	}
	query := func(i int, q string) string {
		t.Helper()
		conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addrs()[i]}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var s string
		if err := conn.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatalf("r%d: %s: %v", i+1, q, err)
		}
		return s
	}
	for i := range 2 {
		if got := query(i, "SELECT toString(count()) || '/' || toString(uniqExact(shard_num)) FROM system.clusters WHERE cluster = 'ledger'"); got != "2/1" {
			t.Errorf("r%d: replicas/shards of cluster ledger %s, want 2/1", i+1, got)
		}
		if got := query(i, "SELECT arrayStringConcat(groupArray(substitution), ',') FROM (SELECT * FROM system.macros ORDER BY macro)"); got != ReplicaName(i)+","+Shard {
			t.Errorf("r%d: macros %q", i+1, got)
		}
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addrs()[0]}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS probe ON CLUSTER ledger"); err != nil {
		t.Fatalf("ON CLUSTER: %v", err)
	}
	if got := query(1, "SELECT toString(count()) FROM system.databases WHERE name = 'probe'"); got != "1" {
		t.Fatalf("the database made ON CLUSTER through r1 is not on r2")
	}
	pid := c.Replica(1).PID()
	c.Kill(1)
	if err := c.Restart(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if c.Replica(1).PID() == pid || c.Replica(1).PID() == 0 {
		t.Fatalf("r2 not restarted (pid %d, was %d)", c.Replica(1).PID(), pid)
	}
}
