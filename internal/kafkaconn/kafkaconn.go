// Package kafkaconn is how every playpipe Kafka client reaches the brokers:
// seed addresses, SASL and TLS, as franz-go options. It is the bottom floor
// that both the fleet library (producer, which re-exports SASL and TLS as
// its own Config's types) and the roles' settings (internal/kafkax) stand
// on, so neither imports the other. It imports nothing of playpipe's.
//
// Errors name the fields of SASL and TLS (SASL.Mechanism, SASL.User,
// TLS.CAFile) and never hold the password.
package kafkaconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanisms accepted by SASL.Mechanism (case-insensitive).
const (
	SASLNone        = ""
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASL authenticates the connections to the brokers.
type SASL struct {
	// Mechanism is one of SASLNone (no authentication), SASLPlain,
	// SASLScramSHA256 or SASLScramSHA512.
	Mechanism string
	// User is required with a Mechanism.
	User string
	// Password is a secret: it is never logged or put in errors.
	Password string
}

// ClientOpts returns the franz-go option that authenticates with s; none
// without a Mechanism.
func (s SASL) ClientOpts() ([]kgo.Opt, error) {
	var m sasl.Mechanism
	switch strings.ToUpper(s.Mechanism) {
	case SASLNone:
		return nil, nil
	case SASLPlain:
		m = plain.Auth{User: s.User, Pass: s.Password}.AsMechanism()
	case SASLScramSHA256:
		m = scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism()
	case SASLScramSHA512:
		m = scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()
	default:
		return nil, fmt.Errorf("kafka: SASL.Mechanism %q is not supported; accepted: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or empty", s.Mechanism)
	}
	if s.User == "" {
		return nil, errors.New("kafka: SASL.User is required with SASL.Mechanism")
	}
	return []kgo.Opt{kgo.SASL(m)}, nil
}

// TLS encrypts the connections to the brokers.
type TLS struct {
	// Enabled turns TLS on (TLS 1.2 or later).
	Enabled bool
	// CAFile is a PEM bundle of CAs to trust besides the system's.
	CAFile string
	// InsecureSkipVerify skips the brokers' certificate verification
	// (testing only).
	InsecureSkipVerify bool
}

// ClientConfig returns the crypto/tls configuration of t, nil when TLS is
// not enabled. Any Kafka client can use it.
func (t TLS) ClientConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // opt-in for tests
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka: read TLS.CAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka: TLS.CAFile %s holds no PEM certificate", t.CAFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// Opts returns the franz-go options that reach brokers (host:port each)
// with s and t: seed brokers, SASL, TLS. Clients add their own.
func Opts(brokers []string, s SASL, t TLS) ([]kgo.Opt, error) {
	for _, b := range brokers {
		if !strings.Contains(b, ":") {
			return nil, fmt.Errorf("kafka: broker %q must be host:port", b)
		}
	}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	auth, err := s.ClientOpts()
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	tc, err := t.ClientConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	return opts, nil
}
