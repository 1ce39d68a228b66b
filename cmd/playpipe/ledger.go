package main

import (
	"context"
	"log/slog"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/analytics"
)

// openLedger opens the ClickHouse ledger the flags name: --clickhouse-addr,
// or the server of --clickhouse-data (started when none runs there; one
// already running is reused and left running). It returns the effective
// configuration and the connection; closeLedger closes the connection, then
// stops a server it started.
func openLedger(ctx context.Context, cfg analytics.Config, log *slog.Logger) (_ analytics.Config, _ driver.Conn, closeLedger func(), _ error) {
	if err := requireClickHouse(cfg); err != nil {
		return cfg, nil, nil, err
	}
	cfg, stopCH, err := localOrConfigured(ctx, cfg, log)
	if err != nil {
		return cfg, nil, nil, err
	}
	conn, err := cfg.Open()
	if err != nil {
		stopCH()
		return cfg, nil, nil, err
	}
	return cfg, conn, func() {
		conn.Close()
		stopCH()
	}, nil
}
