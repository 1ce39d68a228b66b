package analytics

import (
	"context"
	"crypto/tls"
	"net"
	"time"
)

// writeTimeout bounds each write to a ClickHouse connection: a server that
// stops reading (frozen, or its network gone) fails the write after this
// long instead of blocking it for good. The driver bounds the writes of
// batch.Send by the context (it closes the connection when the context
// ends) but not those of batch.Flush, which the sink's chunked insert uses
// (fillBatch); InsertTimeout still bounds the insert as a whole.
var writeTimeout = time.Minute

// dialer is the driver's DialContext (clickhouse.Options.DialContext): a
// TCP connection, TLS when tlsCfg is set (the driver dials TLS itself only
// without a DialContext), whose writes end by writeTimeout.
func dialer(timeout time.Duration, tlsCfg *tls.Config) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		nd := &net.Dialer{Timeout: timeout}
		var c net.Conn
		var err error
		if tlsCfg != nil {
			c, err = (&tls.Dialer{NetDialer: nd, Config: tlsCfg}).DialContext(ctx, "tcp", addr)
		} else {
			c, err = nd.DialContext(ctx, "tcp", addr)
		}
		if err != nil {
			return nil, err
		}
		return boundedWrites{c}, nil
	}
}

// boundedWrites is a connection whose every Write has a deadline
// writeTimeout away.
type boundedWrites struct{ net.Conn }

func (c boundedWrites) Write(p []byte) (int, error) {
	if err := c.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}
