package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys added by the trace handler.
const (
	LogTraceID = "trace_id"
	LogSpanID  = "span_id"
)

// NewLogger returns a logger writing to w in format "json" (production) or
// "text", at level "debug", "info", "warn" or "error". Every record logged
// with a context that carries a span gets trace_id and span_id, and
// attributes whose key names a secret (see IsSecretKey) are redacted.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("%w: log level %q; accepted: debug, info, warn, error", ErrInvalidConfig, level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: RedactSecretKeys}
	var h slog.Handler
	switch strings.ToLower(format) {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("%w: log format %q; accepted: text, json", ErrInvalidConfig, format)
	}
	return slog.New(NewTraceHandler(h)), nil
}

// NewTraceHandler wraps h so that each record whose context carries a valid
// span context gets trace_id and span_id attributes (W3C hex). Log with the
// *Context methods (log.InfoContext(ctx, …)) to get them.
func NewTraceHandler(h slog.Handler) slog.Handler {
	if th, ok := h.(traceHandler); ok {
		return th
	}
	return traceHandler{h}
}

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}

// redactedText replaces a secret in logs.
const redactedText = "[REDACTED]"

// Redacted returns a log value that shows that a secret is set without
// showing it: "[REDACTED]", or "" when s is empty.
//
//	log.Info("session", "client_signature", telemetry.Redacted(sig))
func Redacted(s string) slog.Value {
	if s == "" {
		return slog.StringValue("")
	}
	return slog.StringValue(redactedText)
}

// secretKeys are attribute keys (lower case, '-' and '.' read as '_') whose
// values are always redacted by NewLogger.
var secretKeys = map[string]bool{
	"authorization":    true,
	"token":            true,
	"access_token":     true,
	"session_token":    true,
	"client_signature": true,
	"signature":        true,
	"password":         true,
	"passwd":           true,
	"secret":           true,
	"api_key":          true,
	"apikey":           true,
	"x_api_key":        true,
	"cookie":           true,
	"set_cookie":       true,
	"kafka_password":   true,
}

// IsSecretKey reports whether an attribute or header key names a secret
// (authorization, token, client_signature, password, api_key, …).
func IsSecretKey(key string) bool {
	k := strings.ToLower(key)
	k = strings.NewReplacer("-", "_", ".", "_").Replace(k)
	return secretKeys[k]
}

// RedactSecretKeys is a slog.HandlerOptions.ReplaceAttr that redacts the
// values of attributes whose key names a secret (IsSecretKey). It is a second
// line of defence behind Redacted.
func RedactSecretKeys(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindGroup && IsSecretKey(a.Key) {
		if a.Value.Kind() == slog.KindString {
			a.Value = Redacted(a.Value.String())
		} else {
			a.Value = slog.StringValue(redactedText)
		}
	}
	return a
}
