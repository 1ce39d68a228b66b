// Package chlocal runs a real ClickHouse server as a child process in a data
// folder of the caller's, for tests, the demo and single-machine runs where no
// ClickHouse address is configured.
//
// It finds the server binary (clickhouse-server, or the single clickhouse
// binary of newer releases run as `clickhouse server`) on PATH or in
// /usr/sbin and /usr/bin, writes a minimal configuration into the folder
// (loopback only, native and HTTP ports picked free below the ephemeral range (loopport), one passwordless
// `default` user limited to loopback, logs to files, no interserver or MySQL
// ports, no system log tables), starts it and waits until it answers a query.
//
// A Server can be stopped (SIGTERM, then SIGKILL when the context ends) and
// started again on the same folder and ports: the data is kept, so tests can
// take ClickHouse away for a while and bring it back. A missing binary is
// reported as ErrNotInstalled with the command that installs it.
//
// A Server is safe for concurrent use; the child process is started with a
// parent-death signal so a crashed test does not leave it running.
package chlocal
