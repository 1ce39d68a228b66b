package analytics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/internal/chlocal"
)

// Defaults of Config.
const (
	DefaultDatabase = "playpipe"
	DefaultUser     = "default"
)

// ErrNoClickHouse is returned (wrapped) by RequireServer and
// LocalOrConfigured when neither an address nor a local data folder is
// configured: there is no implicit local server.
var ErrNoClickHouse = errors.New("no ClickHouse configured")

// Config is the ClickHouse connection of the sink, the audit and the demo.
type Config struct {
	// Addr is the native-protocol address(es), host:port, comma separated.
	// Required unless DataDir is set.
	Addr string
	// Database holds the ledger tables; defaults to "playpipe". Created by
	// the migrations when missing.
	Database string
	// User defaults to "default".
	User string
	// Password is a secret: never logged or put in errors (cmd/playpipe
	// reads it from the environment only, never from a flag).
	Password string
	// TLS connects with TLS (system roots).
	TLS bool
	// DataDir asks for a local clickhouse-server in this folder instead of
	// Addr (started, or reused when one already runs there; see
	// LocalOrConfigured). The two exclude each other.
	DataDir string
	// ServerBinary is the ClickHouse server executable LocalOrConfigured
	// starts for DataDir; defaults to the first of clickhouse-server and
	// clickhouse found on PATH or in the system folders (chlocal.FindBinary).
	ServerBinary string
	// DialTimeout defaults to 5 s.
	DialTimeout time.Duration
	// Cluster, when set, names the servers' cluster (an entry of their
	// <remote_servers>, one shard of replicas) that holds a replicated
	// ledger: the migrations run ON CLUSTER, the sink writes the replicated
	// <table>_local tables of the replica it reached, and the reads go
	// through the Distributed tables (see WriteTable,
	// MigrateCluster; docs/audit.md, "A replicated ledger"). Empty (the
	// default): the single-server ledger.
	Cluster string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// withDefaults fills the defaults of unset fields.
func (c Config) withDefaults() Config {
	if c.Database == "" {
		c.Database = DefaultDatabase
	}
	if c.User == "" {
		c.User = DefaultUser
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	return c
}

// Validate checks the configuration once; errors name the flag.
func (c Config) Validate() error {
	c = c.withDefaults()
	if !identRE.MatchString(c.Database) {
		return fmt.Errorf("analytics: --clickhouse-db %q must be an identifier: a letter or _, then letters, digits or _ (at most 63)", c.Database)
	}
	if c.Cluster != "" && !identRE.MatchString(c.Cluster) {
		return fmt.Errorf("analytics: --clickhouse-cluster %q must be an identifier: a letter or _, then letters, digits or _ (at most 63)", c.Cluster)
	}
	for _, a := range c.addrs() {
		if !strings.Contains(a, ":") {
			return fmt.Errorf("analytics: --clickhouse-addr %q must be host:port (the native port, 9000 by default)", a)
		}
	}
	return nil
}

// RequireServer checks, before anything starts, that the configuration
// names exactly one ClickHouse: an error wrapping ErrNoClickHouse when
// neither Addr nor DataDir is set, another when both are. The messages name
// the flags.
func (c Config) RequireServer() error {
	switch {
	case c.Addr == "" && c.DataDir == "":
		return fmt.Errorf("%w: set --clickhouse-addr host:port or pass --clickhouse-data DIR to run a local clickhouse-server with its data in DIR", ErrNoClickHouse)
	case c.Addr != "" && c.DataDir != "":
		return fmt.Errorf("analytics: --clickhouse-addr (%s) and --clickhouse-data (%s) exclude each other: set one", c.Addr, c.DataDir)
	}
	return nil
}

func (c Config) addrs() []string {
	var out []string
	for _, p := range strings.Split(c.Addr, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Open returns a pooled native-protocol connection (lazy: it dials on first
// use). Table names in playpipe's queries are always qualified with the
// database, so the connection's default database is left to the server.
func (c Config) Open() (driver.Conn, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	if c.Addr == "" {
		return nil, errors.New("analytics: no ClickHouse address configured (--clickhouse-addr)")
	}
	opts := &clickhouse.Options{
		Addr:            c.addrs(),
		Auth:            clickhouse.Auth{Username: c.User, Password: c.Password},
		DialTimeout:     c.DialTimeout,
		MaxOpenConns:    8,
		MaxIdleConns:    4,
		ConnMaxLifetime: time.Hour,
	}
	if c.TLS {
		opts.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	opts.DialContext = dialer(c.DialTimeout, opts.TLS) // writes bounded (dial.go)
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("analytics: clickhouse %s: %w", c.Addr, err)
	}
	return conn, nil
}

// LocalOrConfigured returns cfg unchanged when an address is configured.
// With DataDir instead it starts a local ClickHouse server in that folder (or
// reuses the one another playpipe process runs there, on its ports), says
// so, and returns a config pointing at it plus a stop function that stops
// the server in order (a no-op for a reused one). A server it started is
// watched until stop: if it dies (a crash, a kill by pid) it is started
// again on the same ports with its data (chlocal.Server.Watch), so clients
// reconnect. With neither Addr nor DataDir it refuses with ErrNoClickHouse.
func LocalOrConfigured(ctx context.Context, cfg Config, log *slog.Logger) (Config, func(), error) {
	if err := cfg.Validate(); err != nil {
		return cfg, func() {}, err
	}
	if err := cfg.RequireServer(); err != nil {
		return cfg, func() {}, err
	}
	cfg = cfg.withDefaults()
	if cfg.DataDir == "" {
		return cfg, func() {}, nil
	}
	if log == nil {
		log = slog.Default()
	}
	s, err := chlocal.Start(ctx, chlocal.Config{Dir: cfg.DataDir, Binary: cfg.ServerBinary, Reuse: true, Logger: log})
	if err != nil {
		return cfg, func() {}, fmt.Errorf("analytics: --clickhouse-data %s: the local server did not start: %w", cfg.DataDir, err)
	}
	cfg.Addr, cfg.User, cfg.Password, cfg.TLS = s.Addr(), "default", "", false
	if s.Owned() {
		log.Warn("--clickhouse-data: started a local ClickHouse server (data kept in the folder)", "dir", s.Dir(), "addr", cfg.Addr)
	}
	wctx, stopWatch := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { // owner: the stop function below
		defer close(watched)
		s.Watch(wctx)
	}()
	stop := func() {
		stopWatch()
		<-watched
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = s.Stop(sctx)
	}
	return cfg, stop, nil
}
