package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/chlocal"
)

// Environment variables of the --clickhouse-* flags (their defaults; the
// password is read from the environment only, never a flag).
const (
	envClickHouseAddr     = "PLAYPIPE_CLICKHOUSE_ADDR"
	envClickHouseDatabase = "PLAYPIPE_CLICKHOUSE_DATABASE"
	envClickHouseUser     = "PLAYPIPE_CLICKHOUSE_USER"
	envClickHousePassword = "PLAYPIPE_CLICKHOUSE_PASSWORD"
	envClickHouseTLS      = "PLAYPIPE_CLICKHOUSE_TLS"
	envClickHouseData     = "PLAYPIPE_CLICKHOUSE_DATA"
	envClickHouseBin      = "PLAYPIPE_CLICKHOUSE_BIN"
)

// registerClickHouseFlags binds the --clickhouse-* flags to c; defaults come
// from the environment variables named in each flag's help, the password
// from envClickHousePassword only.
func registerClickHouseFlags(fs *flag.FlagSet, c *analytics.Config) {
	fs.StringVar(&c.Addr, "clickhouse-addr", os.Getenv(envClickHouseAddr), "ClickHouse native address host:port, comma separated (env "+envClickHouseAddr+"); required unless --clickhouse-data")
	fs.StringVar(&c.Database, "clickhouse-db", envDefault(envClickHouseDatabase, analytics.DefaultDatabase), "ClickHouse database of the ledger (env "+envClickHouseDatabase+")")
	fs.StringVar(&c.User, "clickhouse-user", envDefault(envClickHouseUser, analytics.DefaultUser), "ClickHouse user (env "+envClickHouseUser+"; the password is read from "+envClickHousePassword+" only)")
	c.Password = os.Getenv(envClickHousePassword)
	fs.BoolVar(&c.TLS, "clickhouse-tls", os.Getenv(envClickHouseTLS) == "true", "connect to ClickHouse with TLS (env "+envClickHouseTLS+"=true)")
	fs.StringVar(&c.DataDir, "clickhouse-data", os.Getenv(envClickHouseData), "instead of --clickhouse-addr: run a local clickhouse-server with its data in this folder, or reuse the one already running there (env "+envClickHouseData+")")
	fs.StringVar(&c.ServerBinary, "clickhouse-bin", os.Getenv(envClickHouseBin), "with --clickhouse-data: the ClickHouse server binary to run (env "+envClickHouseBin+"; default: clickhouse-server or clickhouse on PATH, /usr/sbin, /usr/bin, /usr/local/bin)")
}

// requireClickHouse reports a role with neither --clickhouse-addr nor
// --clickhouse-data (or both) as a usage error naming the flags and their
// environment variables.
func requireClickHouse(cfg analytics.Config) error {
	return requireServer(cfg.Validate, func() error {
		if err := cfg.RequireServer(); err != nil {
			return fmt.Errorf("%w (env %s counts as --clickhouse-addr, %s as --clickhouse-data)", err, envClickHouseAddr, envClickHouseData)
		}
		return nil
	}, "analytics")
}

// localOrConfigured is analytics.LocalOrConfigured; when no server binary
// is found its error says how to name one or use a running server.
func localOrConfigured(ctx context.Context, cfg analytics.Config, log *slog.Logger) (analytics.Config, func(), error) {
	cfg, stop, err := analytics.LocalOrConfigured(ctx, cfg, log)
	if errors.Is(err, chlocal.ErrNotInstalled) {
		err = fmt.Errorf("%w (--clickhouse-bin or env %s names the binary; --clickhouse-addr or env %s a running server)", err, envClickHouseBin, envClickHouseAddr)
	}
	return cfg, stop, err
}
