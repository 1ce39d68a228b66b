package main

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestClusterFlag: --clickhouse-cluster defaults to its environment
// variable, the flag wins, every command with ClickHouse flags has it
// (migrate also as --cluster), and a name that is no identifier or a
// cluster for the demo is a usage error (exit 2) naming the flag.
func TestClusterFlag(t *testing.T) {
	clearTargetEnv(t)
	t.Setenv(envClickHouseCluster, "fromenv")
	var c analytics.Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	registerClickHouseFlags(fs, &c)
	if c.Cluster != "fromenv" {
		t.Fatalf("Cluster %q from %s", c.Cluster, envClickHouseCluster)
	}
	if err := fs.Parse([]string{"--clickhouse-cluster", "fromflag"}); err != nil || c.Cluster != "fromflag" {
		t.Fatalf("flag over env: %q, %v", c.Cluster, err)
	}
	t.Setenv(envClickHouseCluster, "")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"migrate", "--cluster", "bad-name", "--clickhouse-addr", "127.0.0.1:1"}, []string{"--clickhouse-cluster", "identifier"}},
		{[]string{"sink", "--brokers", "127.0.0.1:1", "--clickhouse-cluster", "x y", "--clickhouse-addr", "127.0.0.1:1", "--admin-addr", "off"}, []string{"--clickhouse-cluster"}},
		{[]string{"audit", "--clickhouse-cluster", "1bad", "--clickhouse-addr", "127.0.0.1:1"}, []string{"--clickhouse-cluster"}},
		{[]string{"demo", "--clickhouse-cluster", "ledger"}, []string{"--clickhouse-cluster", "one server"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out, errb bytes.Buffer
		code := runMain(ctx, c.args, &out, &errb)
		cancel()
		if code != 2 {
			t.Errorf("%v: exit %d, want 2; stderr:\n%s", c.args, code, errb.String())
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(errb.String(), w) {
				t.Errorf("%v: stderr does not say %q:\n%s", c.args, w, errb.String())
			}
		}
	}
}

// TestMigrateClusterRefusals: `playpipe migrate --cluster` on a server
// without that cluster fails naming system.clusters and creates nothing;
// on a single-server ledger, a cluster name is refused and so, the other
// way round, is nothing (the single-server migrate stays the default).
func TestMigrateClusterRefusals(t *testing.T) {
	clearTargetEnv(t)
	ch := testenv.StartClickHouse(t)
	args := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}
	run := func(extra ...string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out, errb bytes.Buffer
		code := runMain(ctx, append(append([]string{"migrate"}, args...), extra...), &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, msg := run("--cluster", "ledger"); code == 0 || !strings.Contains(msg, "no such cluster") || !strings.Contains(msg, "system.clusters") {
		t.Fatalf("migrate --cluster on a server without the cluster: exit %d: %s", code, msg)
	}
	if code, msg := run(); code != 0 || !strings.Contains(msg, "applied [") || strings.Contains(msg, "on cluster") {
		t.Fatalf("migrate: exit %d: %s", code, msg)
	}
}
