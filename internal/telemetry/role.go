package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
)

// Role is what a role's command starts for telemetry: Setup (service name
// "playpipe-<role>") and, unless the address is "off", the admin server
// running in its own goroutine. Close stops both.
//
//	tel, err := telemetry.StartRole(ctx, "consume", *adminAddr, log)
//	if err != nil { return err }
//	defer tel.Close(context.Background())
//	tel.AddReadyCheck("kafka", func(ctx context.Context) error { return cl.Ping(ctx) })
type Role struct {
	// Admin is nil when the admin server is off.
	Admin *AdminServer
	// Providers are the tracer and meter providers and the propagator that
	// Setup built, for the role's libraries (their Config fields) and
	// HTTPHandler.
	Providers Providers

	shutdown func(context.Context) error
	cancel   context.CancelFunc
	done     chan error
}

// StartRole runs Setup for role and starts the admin server on adminAddr
// (cmd/playpipe binds it to --admin-addr). The admin port is bound before StartRole returns, so
// a busy port is reported here. log may be nil.
func StartRole(ctx context.Context, role, adminAddr string, log *slog.Logger) (*Role, error) {
	providers, shutdown, err := Setup(ctx, Config{
		ServiceName: "playpipe-" + role,
		Attributes:  []attribute.KeyValue{attribute.String("playpipe.role", role)},
	})
	if err != nil {
		return nil, err
	}
	r := &Role{shutdown: shutdown, Providers: providers}
	if !AdminEnabled(adminAddr) {
		return r, nil
	}
	r.Admin = NewAdminServer(adminAddr, log)
	if _, err := r.Admin.Listen(); err != nil {
		return nil, errors.Join(fmt.Errorf("--admin-addr: %w", err), shutdown(ctx))
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	r.done = make(chan error, 1)
	go func() { r.done <- r.Admin.Run(actx) }()
	return r, nil
}

// AddReadyCheck registers a /readyz check (no-op when the admin server is off).
func (r *Role) AddReadyCheck(name string, fn ReadyCheck) {
	if r.Admin != nil {
		r.Admin.AddReadyCheck(name, fn)
	}
}

// Close stops the admin server (readyz fails first, requests in flight
// finish) and then flushes and stops telemetry. It is idempotent.
func (r *Role) Close(ctx context.Context) error {
	var errs []error
	if r.cancel != nil {
		r.cancel()
		if err, ok := <-r.done; ok {
			errs = append(errs, err)
			close(r.done)
		}
	}
	errs = append(errs, r.shutdown(ctx))
	return errors.Join(errs...)
}
