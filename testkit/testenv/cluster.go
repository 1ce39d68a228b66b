package testenv

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/internal/chlocal"
	"github.com/playpipe/playpipe/testkit/chcluster"
)

// ClickHouseCluster is a replicated ClickHouse for one test: Debian's
// ZooKeeper and two clickhouse-server replicas of a 1-shard cluster
// (testkit/chcluster), in a temporary folder (in /dev/shm when it
// exists), killed when the test ends.
type ClickHouseCluster struct {
	*chcluster.Cluster
	// Database is the test's ledger database: not created here (the
	// migrations create it ON CLUSTER).
	Database string
}

// StartClickHouseCluster starts the cluster. Without ZooKeeper or a
// ClickHouse binary the test is skipped, saying how to install them,
// unless PLAYPIPE_REQUIRE_CLICKHOUSE=1 (CI, make test) makes that a
// failure.
func StartClickHouseCluster(t testing.TB) *ClickHouseCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	c, err := chcluster.Start(ctx, chcluster.Config{Dir: clickHouseDir(t), Logger: Logger(t)})
	if (errors.Is(err, chlocal.ErrNotInstalled) || errors.Is(err, chcluster.ErrZooKeeperNotInstalled)) && os.Getenv("PLAYPIPE_REQUIRE_CLICKHOUSE") != "1" {
		t.Skipf("testenv: %v", err)
	}
	if err != nil {
		t.Fatalf("testenv: replicated ClickHouse: %v", err)
	}
	t.Cleanup(c.Close)
	t.Logf("testenv: ZooKeeper %s and replicas %v of cluster %s ready in %s", c.ZooKeeper().Addr(), c.Addrs(), c.Name(), time.Since(began).Round(time.Millisecond))
	return &ClickHouseCluster{Cluster: c, Database: testDatabaseName(t)}
}

// Addr is every replica's native address, comma separated (a client
// reaches whichever answers first, in this order).
func (c *ClickHouseCluster) Addr() string { return strings.Join(c.Addrs(), ",") }

// Conn returns a connection to replica i only, closed when the test ends.
func (c *ClickHouseCluster) Conn(t testing.TB, i int) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addrs()[i]}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("testenv: clickhouse open %s: %v", c.Addrs()[i], err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
