package main

import (
	"context"
	"fmt"
	"io"

	"github.com/playpipe/playpipe/analytics"
)

func init() {
	register(command{
		name:    "migrate",
		summary: "create or upgrade the audit ledger's tables in ClickHouse",
		run:     runMigrate,
	})
}

const migrateSynopsis = `Applies the ledger's schema migrations that the ClickHouse database has not recorded yet
(table <db>.schema_migrations) and prints the schema version. Safe to run any number of
times; the sink runs it at start-up too. Full guide: docs/audit.md.

Example:
  playpipe migrate --clickhouse-addr clickhouse:9000 --clickhouse-db playpipe

A replicated ledger on a cluster of one shard of replicas (docs/audit.md, "A replicated
ledger"): the tables are created ON CLUSTER, Replicated*MergeTree as <table>_local under
the servers' {shard}/{replica} macros, plus Distributed tables <table> for reads:
  playpipe migrate --cluster ledger --clickhouse-addr ch-1:9000,ch-2:9000
(--cluster is --clickhouse-cluster, env PLAYPIPE_CLICKHOUSE_CLUSTER; the sink, audit,
replay and redrive take the same flag.)

--clickhouse-addr or --clickhouse-data DIR is required. With --clickhouse-data, a
clickhouse-server already running in DIR (a sink's) is reused on its ports and left
running; otherwise one is started for the migration and stopped after it.`

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", stderr, migrateSynopsis)
	var (
		lf  logFlags
		cfg analytics.Config
	)
	registerClickHouseFlags(fs, &cfg)
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "short for --clickhouse-cluster")
	lf.register(fs.StringVar)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	cfg, conn, closeLedger, err := openLedger(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeLedger()
	applied, err := cfg.Migrate(ctx, conn)
	if err != nil {
		return err
	}
	where := cfg.Database + ".*"
	if cfg.Cluster != "" {
		where += " (on cluster " + cfg.Cluster + ")"
	}
	if len(applied) == 0 {
		fmt.Fprintf(stdout, "migrate: %s is at schema version %d; nothing to apply\n", where, analytics.LatestVersion())
		return nil
	}
	fmt.Fprintf(stdout, "migrate: applied %v; %s is at schema version %d\n", applied, where, analytics.LatestVersion())
	return nil
}
