package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/version"
	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/wiring/roles"
)

// demoGateway is the ingest gateway of the demo, on loopback.
type demoGateway struct {
	addr  string
	key   string
	pub   *producer.Publisher
	srv   *http.Server
	done  chan struct{}
	close func()
}

func startDemoGateway(ctx context.Context, k kafkax.Config, log *slog.Logger) (*demoGateway, error) {
	pub, err := producer.NewPublisher(ctx, roles.Publisher(k))
	if err != nil {
		return nil, err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	key := hex.EncodeToString(raw)
	fk, err := gateway.ParseFleetKey("demo-fleet:" + gateway.HashKey(key))
	if err != nil {
		return nil, err
	}
	gw, err := gateway.New(gateway.Config{Publisher: pub, Keys: []gateway.FleetKey{fk}, Logger: log})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("ingest listen: %w", err)
	}
	g := &demoGateway{addr: ln.Addr().String(), key: key, pub: pub, done: make(chan struct{}),
		srv: &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(g.done)
		_ = g.srv.Serve(ln) // http.ErrServerClosed on shutdown
	}()
	g.close = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gw.SetDraining()
		_ = g.srv.Shutdown(sctx)
		<-g.done
		_ = pub.Close(sctx)
	}
	return g, nil
}

// send posts simulated segments to the gateway as NDJSON batches of 100 and
// returns how many it accepted onto the events topic (also added to onTopic
// as they are accepted).
func (g *demoGateway) send(ctx context.Context, cfg simulator.Config, onTopic *atomic.Int64) (int, error) {
	if cfg.Events == 0 {
		return 0, nil
	}
	gen, err := simulator.NewGenerator(cfg)
	if err != nil {
		return 0, err
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	accepted := 0
	var batch bytes.Buffer
	n := 0
	every := time.Duration(0)
	if cfg.Rate > 0 {
		every = time.Duration(float64(time.Second) * 100 / cfg.Rate)
	}
	flush := func() error {
		if n == 0 {
			return nil
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.addr+"/v1/events", bytes.NewReader(batch.Bytes()))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Authorization", "Bearer "+g.key)
		req.Header.Set("User-Agent", version.UserAgent())
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("ingest: %w", err)
		}
		defer resp.Body.Close()
		var ir gateway.IngestResponse
		if err := json.NewDecoder(resp.Body).Decode(&ir); err != nil {
			return fmt.Errorf("ingest: answer %d: %w", resp.StatusCode, err)
		}
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("ingest: answer %d: %s", resp.StatusCode, ir.Error)
		}
		accepted += ir.Accepted
		onTopic.Add(int64(ir.Accepted))
		batch.Reset()
		n = 0
		if every > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(every):
			}
		}
		return nil
	}
	for m, ok := gen.Next(); ok; m, ok = gen.Next() {
		batch.Write(bytes.ReplaceAll(m.Value, []byte("\n"), []byte(" ")))
		batch.WriteByte('\n')
		if n++; n == 100 {
			if err := flush(); err != nil {
				return accepted, err
			}
		}
	}
	return accepted, flush()
}
