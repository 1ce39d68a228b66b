package main

import (
	"flag"
	"os"

	"github.com/playpipe/playpipe/analytics"
)

// envClickHouseCluster is the default of --clickhouse-cluster.
const envClickHouseCluster = "PLAYPIPE_CLICKHOUSE_CLUSTER"

// registerClickHouseFlags binds the --clickhouse-* flags to c; defaults come
// from the environment variables named in each flag's help, the password
// from analytics.EnvPassword only.
func registerClickHouseFlags(fs *flag.FlagSet, c *analytics.Config) {
	fs.StringVar(&c.Addr, "clickhouse-addr", os.Getenv(analytics.EnvAddr), "ClickHouse native address host:port, comma separated (env "+analytics.EnvAddr+"); required unless --clickhouse-data")
	fs.StringVar(&c.Database, "clickhouse-db", envDefault(analytics.EnvDatabase, analytics.DefaultDatabase), "ClickHouse database of the ledger (env "+analytics.EnvDatabase+")")
	fs.StringVar(&c.User, "clickhouse-user", envDefault(analytics.EnvUser, analytics.DefaultUser), "ClickHouse user (env "+analytics.EnvUser+"; the password is read from "+analytics.EnvPassword+" only)")
	c.Password = os.Getenv(analytics.EnvPassword)
	fs.BoolVar(&c.TLS, "clickhouse-tls", os.Getenv(analytics.EnvTLS) == "true", "connect to ClickHouse with TLS (env "+analytics.EnvTLS+"=true)")
	fs.StringVar(&c.Cluster, "clickhouse-cluster", os.Getenv(envClickHouseCluster), "the servers' cluster (a <remote_servers> entry: one shard of replicas) holding a replicated ledger: ON CLUSTER migrations, Replicated tables written through any replica, reads through Distributed tables (env "+envClickHouseCluster+"); empty: one server")
	fs.StringVar(&c.DataDir, "clickhouse-data", os.Getenv(analytics.EnvDataDir), "instead of --clickhouse-addr: run a local clickhouse-server with its data in this folder, or reuse the one already running there (env "+analytics.EnvDataDir+")")
}

// requireClickHouse reports a role with neither --clickhouse-addr nor
// --clickhouse-data (or both) as a usage error naming the flags.
func requireClickHouse(cfg analytics.Config) error {
	return requireServer(cfg.Validate, cfg.RequireServer, "analytics")
}
