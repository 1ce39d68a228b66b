package partnerapi

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/backoff"
)

// token is a session token with its lifetime. hdr is the Authorization
// header value (the raw JWT, no "Bearer "), shared read-only by requests.
type token struct {
	hdr     []string
	standby bool
	renewAt time.Time // renew in the background from here on
	expires time.Time // never used from here on
}

// String keeps the token out of any accidental print.
func (t *token) String() string { return redacted }

// GoString keeps the token out of %#v.
func (t *token) GoString() string { return redacted }

// slot holds the token of one session endpoint and renews it single flight:
// however many goroutines find it missing or expired at once, one session
// call is made and all of them wait for it.
type slot struct {
	c        *Client
	path     string
	op       call
	withUser bool

	cur atomic.Pointer[token]

	mu      sync.Mutex
	flight  *flight
	retryAt time.Time // no background renewal before this (after one failed)
}

type flight struct {
	done chan struct{}
	tok  *token
	err  error
}

// token returns a usable token: the held one while it is fresh; the held one
// plus a background renewal when it is close to expiry; otherwise it waits
// for a renewal (joining one in flight).
func (s *slot) token(ctx context.Context) (*token, error) {
	if t := s.cur.Load(); t != nil {
		now := s.c.cfg.Now()
		if now.Before(t.renewAt) {
			return t, nil
		}
		if now.Before(t.expires) {
			s.renewAsync(t)
			return t, nil
		}
	}
	return s.renew(ctx)
}

// drop forgets t if it is still the held token (a later token is kept), so
// that the next call takes a new session.
func (s *slot) drop(t *token) {
	s.cur.CompareAndSwap(t, nil)
}

// renewAsync starts a background renewal of stale unless one is in flight,
// another token took its place, or a failed one is backing off (without
// this, every call in the renewal window would start a session call while
// the session endpoint is down).
func (s *slot) renewAsync(stale *token) {
	s.mu.Lock()
	if s.flight == nil && s.cur.Load() == stale && !s.c.cfg.Now().Before(s.retryAt) {
		s.startLocked()
	}
	s.mu.Unlock()
}

func (s *slot) renew(ctx context.Context) (*token, error) {
	s.mu.Lock()
	if t := s.cur.Load(); t != nil && s.c.cfg.Now().Before(t.expires) {
		// Renewed by another caller between our check and the lock.
		s.mu.Unlock()
		return t, nil
	}
	f := s.flight
	if f == nil {
		f = s.startLocked()
	}
	s.mu.Unlock()
	if f == nil {
		return nil, ErrClosed
	}
	select {
	case <-f.done:
		return f.tok, f.err
	case <-ctx.Done():
		return nil, &Error{Kind: KindTransient, Endpoint: s.op.ep, Op: s.op.name, Reason: "waiting for a session", Err: ctx.Err()}
	}
}

// startLocked starts a session call owned by the client (not by the caller
// that triggered it, whose context may end first). s.mu is held.
func (s *slot) startLocked() *flight {
	c := s.c
	if c.closed.Load() {
		return nil
	}
	f := &flight{done: make(chan struct{})}
	s.flight = f
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		tok, _, err := c.createSession(c.root, s, c.cfg.MaxAttempts, false)
		s.mu.Lock()
		if err == nil {
			s.cur.Store(tok)
			s.retryAt = time.Time{}
		} else {
			s.retryAt = c.cfg.Now().Add(max(c.cfg.MaxBackoff, time.Second))
		}
		s.flight = nil
		s.mu.Unlock()
		f.tok, f.err = tok, err
		close(f.done)
	}()
	return f
}

// Session forces a new session now (POST /partners/session, one attempt) and
// adopts its token for every later call. Meta tells whether live service or
// standby answered: the reporter uses it as its live-service probe. A
// standby-minted token is used for at most StandbyTokenTTL.
func (c *Client) Session(ctx context.Context) (Meta, error) {
	tok, meta, err := c.createSession(ctx, c.main, 1, true)
	if err != nil {
		return meta, err
	}
	c.main.cur.Store(tok)
	return meta, nil
}

// createSession calls the session endpoint of s, retrying transient errors up
// to attempts times. A probe (Session) logs at debug level only: the reporter
// may probe every few seconds through a whole standby episode.
func (c *Client) createSession(ctx context.Context, s *slot, attempts int, probe bool) (*token, Meta, error) {
	okLevel, failLevel := slog.LevelInfo, slog.LevelWarn
	if probe {
		okLevel, failLevel = slog.LevelDebug, slog.LevelDebug
	}
	ctx, span := c.tracer.Start(ctx, s.op.name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", "POST"), attribute.String("url.path", s.path)))
	defer span.End()
	req := struct {
		ClientID        string `json:"client_id"`
		ClientSignature string `json:"client_signature"`
		Email           string `json:"email,omitempty"`
	}{ClientID: c.cfg.Credentials.ClientID, ClientSignature: c.cfg.Credentials.ClientSignature}
	if s.withUser {
		req.Email = c.cfg.Credentials.Email
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, Meta{}, err
	}
	url := c.base + s.path
	var (
		meta Meta
		tok  *token
	)
	for attempt := 1; ; attempt++ {
		var data []byte
		meta, data, err = c.send(ctx, s.op, http.MethodPost, url, nil, body, "", maxSmallBody)
		if err == nil {
			tok, err = c.newToken(s.op, meta, data)
			if err == nil {
				break
			}
		}
		var e *Error
		if !errors.As(err, &e) || attempt >= attempts {
			break
		}
		d := c.policy.Delay(attempt, e.RetryAfter)
		if !c.retryable(ctx, e, d) || !backoff.Sleep(ctx, d) {
			break
		}
	}
	span.SetAttributes(attribute.Int("http.response.status_code", meta.Status))
	served := string(meta.ServedBy)
	if served == "" {
		served = "live"
	}
	span.SetAttributes(attribute.String("partnerapi.served_by", served))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		c.sessions.Add(context.Background(), 1, metric.WithAttributes(attribute.String("served_by", served), attribute.String("outcome", KindOf(err).String())))
		if !errors.Is(err, context.Canceled) {
			c.log.Log(ctx, failLevel, "partner API session failed", "endpoint", s.path, "error", err)
		}
		return nil, meta, err
	}
	c.sessions.Add(context.Background(), 1, metric.WithAttributes(attribute.String("served_by", served), attribute.String("outcome", "ok")))
	c.log.Log(ctx, okLevel, "partner API session created", "endpoint", s.path, "served_by", served,
		"standby_minted", tok.standby, "renew_in", tok.renewAt.Sub(c.cfg.Now()).Round(time.Second))
	return tok, meta, nil
}

// newToken decodes a session answer and sets the token's lifetime: the
// configured TTL for the mode that minted it, shortened by the JWT's exp
// claim when that is sooner.
func (c *Client) newToken(op call, meta Meta, data []byte) (*token, error) {
	jwt, err := decodeSession(data)
	if err != nil {
		return nil, &Error{Kind: KindTransient, Endpoint: op.ep, Op: op.name, Status: meta.Status, ServedBy: meta.ServedBy,
			Reason: "malformed session answer", Err: err}
	}
	now := c.cfg.Now()
	t := &token{hdr: []string{jwt}, standby: meta.ServedBy == ServedStandby}
	ttl := c.cfg.LiveTokenTTL
	if t.standby {
		ttl = c.cfg.StandbyTokenTTL
	}
	if exp, ok := jwtExpiry(jwt); ok {
		if left := exp.Sub(now); left > 0 && left < ttl {
			ttl = left
		}
	}
	before := min(c.cfg.RenewBefore, ttl/3)
	t.expires = now.Add(ttl)
	t.renewAt = t.expires.Add(-before)
	return t, nil
}
