package chlocal

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
)

// ErrNotInstalled is returned when no ClickHouse server binary can be found.
var ErrNotInstalled = errors.New("chlocal: no ClickHouse server binary found (looked for clickhouse-server and clickhouse on PATH, in /usr/sbin, /usr/bin and /usr/local/bin); " +
	"install it with `apt-get install -y clickhouse-server` (Debian/Ubuntu), or see https://clickhouse.com/docs/en/install, " +
	"or name its path (Config.Binary), or use a running server instead")

// Binary is a located server executable and the arguments that select the
// server mode before the configuration flag.
type Binary struct {
	Path string
	Args []string // nil for clickhouse-server, ["server"] for the single clickhouse binary
}

// FindBinary locates the ClickHouse server: clickhouse-server and
// clickhouse on PATH, then the usual system folders.
func FindBinary() (Binary, error) {
	for _, name := range []string{"clickhouse-server", "clickhouse"} {
		if p, err := exec.LookPath(name); err == nil {
			return binaryFor(p), nil
		}
	}
	for _, dir := range systemDirs {
		for _, name := range []string{"clickhouse-server", "clickhouse"} {
			p := filepath.Join(dir, name)
			if isExecutable(p) {
				return binaryFor(p), nil
			}
		}
	}
	return Binary{}, ErrNotInstalled
}

func binaryFor(p string) Binary {
	if filepath.Base(p) == "clickhouse" {
		return Binary{Path: p, Args: []string{"server"}}
	}
	return Binary{Path: p}
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// systemDirs are searched after PATH.
var systemDirs = []string{"/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"}
