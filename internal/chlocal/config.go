package chlocal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/playpipe/playpipe/internal/loopport"
)

// freePorts picks the native and HTTP ports of a new server, below the
// ephemeral range (loopport): a server restarted on its recorded ports
// (Watch, a test's Restart) finds them free, not taken by an outgoing
// connection's local port.
func freePorts() (int, int, error) {
	ports, err := loopport.Pick(2)
	if err != nil {
		return 0, 0, fmt.Errorf("chlocal: pick free ports: %w", err)
	}
	return ports[0], ports[1], nil
}

func (s *Server) writeConfig() error {
	for _, sub := range []string{"data", "tmp", "log", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(s.dir, sub), 0o755); err != nil {
			return fmt.Errorf("chlocal: data folder: %w", err)
		}
	}
	p := func(sub string) string { return xmlEscape(filepath.Join(s.dir, sub) + "/") }
	// The root element's name is ignored by the configuration loader of
	// every release; 18.16 documents <yandex>, current ones <clickhouse>.
	config := `<?xml version="1.0"?>
<!-- Written by playpipe (internal/chlocal) on every start; edits are overwritten. -->
<yandex>
    <logger>
        <level>warning</level>
        <log>` + p("log") + `server.log</log>
        <errorlog>` + p("log") + `error.log</errorlog>
        <size>10M</size>
        <count>2</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>` + strconv.Itoa(s.tcpPort) + `</tcp_port>
    <http_port>` + strconv.Itoa(s.httpPort) + `</http_port>
    <path>` + p("data") + `</path>
    <tmp_path>` + p("tmp") + `</tmp_path>
    <user_files_path>` + p("user_files") + `</user_files_path>
    <format_schema_path>` + p("format_schemas") + `</format_schema_path>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <mark_cache_size>268435456</mark_cache_size>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <max_concurrent_queries>100</max_concurrent_queries>
    <mlock_executable>false</mlock_executable>
    <shutdown_wait_unfinished>2</shutdown_wait_unfinished>
</yandex>
`
	users := `<?xml version="1.0"?>
<!-- Written by playpipe (internal/chlocal): one passwordless user, loopback only. -->
<yandex>
    <profiles>
        <default>
            <log_queries>0</log_queries>
            <!-- An idle native connection checks for shutdown every poll_interval
                 seconds (default 10): 1 makes a stop take about a second. -->
            <poll_interval>1</poll_interval>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
                <ip>::1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
            <access_management>1</access_management>
        </default>
    </users>
    <quotas>
        <default></default>
    </quotas>
</yandex>
`
	if err := os.WriteFile(filepath.Join(s.dir, "config.xml"), []byte(config), 0o644); err != nil {
		return fmt.Errorf("chlocal: write config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "users.xml"), []byte(users), 0o644); err != nil {
		return fmt.Errorf("chlocal: write users: %w", err)
	}
	return nil
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
