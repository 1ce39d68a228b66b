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
	applied, err := analytics.Migrate(ctx, conn, cfg.Database)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintf(stdout, "migrate: %s.* is at schema version %d; nothing to apply\n", cfg.Database, analytics.LatestVersion())
		return nil
	}
	fmt.Fprintf(stdout, "migrate: applied %v; %s.* is at schema version %d\n", applied, cfg.Database, analytics.LatestVersion())
	return nil
}
