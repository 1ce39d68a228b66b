// Package version holds the build version of playpipe, reported in the
// partner API User-Agent, in telemetry resources and by `playpipe version`.
package version

// Version is overridden at link time with -ldflags "-X github.com/playpipe/playpipe/internal/version.Version=…".
var Version = "0.1.0"

// UserAgent is the product User-Agent every playpipe HTTP client sends to the
// partner API, whose edge layer blocks default library user agents.
func UserAgent() string { return "playpipe/" + Version + " (partner integration)" }
