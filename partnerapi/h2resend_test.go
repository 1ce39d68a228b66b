package partnerapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/playpipe/playpipe/schemas"
)

// h2Frame is one HTTP/2 frame (RFC 9113 §4.1).
type h2Frame struct {
	typ, flags byte
	stream     uint32
	payload    []byte
}

const (
	h2Data, h2Headers, h2RSTStream, h2Settings, h2GoAway = 0x0, 0x1, 0x3, 0x4, 0x7
	h2EndStream, h2Ack                                   = 0x1, 0x1
	h2ProtocolError, h2RefusedStreamCode                 = 0x1, 0x7
)

func readH2Frame(r io.Reader) (h2Frame, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return h2Frame{}, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	f := h2Frame{typ: hdr[3], flags: hdr[4], stream: binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff, payload: make([]byte, n)}
	_, err := io.ReadFull(r, f.payload)
	return f, err
}

func writeH2Frame(w io.Writer, typ, flags byte, stream uint32, payload []byte) error {
	hdr := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hdr[5:], stream)
	_, err := w.Write(append(hdr, payload...))
	return err
}

// h2ResetServer is an HTTP/2 server, spoken frame by frame, whose first
// play report post is read to its end (END_STREAM) and then failed as
// first says — the answers on which net/http's HTTP/2 transport re-sends a
// request whose body it can rewind (GetBody; http2canRetryError):
//   - firstProtocolError: RST_STREAM PROTOCOL_ERROR after the server took
//     the report (golang/go#47635): one copy at the partner;
//   - firstRefused: RST_STREAM REFUSED_STREAM, not processed;
//   - firstGoAway: GOAWAY NO_ERROR with last stream 0, not processed (as
//     nginx after keepalive_requests), and the connection closed.
//
// Later posts are answered 200 with the API's success body. got holds the
// copies the partner took; seen counts every complete body.
type h2ResetServer struct {
	srv   *httptest.Server
	first int
	mu    sync.Mutex
	got   [][]byte
	seen  int
}

const (
	firstProtocolError = iota
	firstRefused
	firstGoAway
)

func newH2ResetServer(t *testing.T, first int) *h2ResetServer {
	t.Helper()
	s := &h2ResetServer{first: first}
	s.srv = httptest.NewUnstartedServer(http.NotFoundHandler())
	s.srv.TLS = &tls.Config{NextProtos: []string{"h2"}}
	s.srv.Config.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){
		"h2": func(_ *http.Server, c *tls.Conn, _ http.Handler) { s.serve(c) },
	}
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *h2ResetServer) copies() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

func (s *h2ResetServer) serve(c *tls.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	preface := make([]byte, len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	if _, err := io.ReadFull(br, preface); err != nil {
		return
	}
	var wmu sync.Mutex
	write := func(typ, flags byte, stream uint32, payload []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		_ = writeH2Frame(c, typ, flags, stream, payload)
	}
	write(h2Settings, 0, 0, nil)
	bodies := map[uint32][]byte{}
	for {
		f, err := readH2Frame(br)
		if err != nil {
			return
		}
		switch f.typ {
		case h2Settings:
			if f.flags&h2Ack == 0 {
				write(h2Settings, h2Ack, 0, nil)
			}
			continue
		case h2Headers:
			bodies[f.stream] = []byte{}
		case h2Data:
			bodies[f.stream] = append(bodies[f.stream], f.payload...)
		default:
			continue
		}
		if f.flags&h2EndStream == 0 {
			continue
		}
		body := bodies[f.stream]
		delete(bodies, f.stream)
		s.mu.Lock()
		s.seen++
		n := s.seen
		if n > 1 || s.first == firstProtocolError {
			s.got = append(s.got, body)
		}
		s.mu.Unlock()
		if n == 1 {
			// The whole report is here; the stream fails all the same.
			switch s.first {
			case firstProtocolError:
				write(h2RSTStream, 0, f.stream, []byte{0, 0, 0, h2ProtocolError})
			case firstRefused:
				write(h2RSTStream, 0, f.stream, []byte{0, 0, 0, h2RefusedStreamCode})
			case firstGoAway:
				write(h2GoAway, 0, 0, make([]byte, 8)) // last stream 0, NO_ERROR
				return
			}
			continue
		}
		write(h2Headers, 0x4, f.stream, []byte{0x88}) // END_HEADERS; ":status: 200" (HPACK static index 8)
		write(h2Data, h2EndStream, f.stream, []byte(`{"error":false,"message":"success"}`))
	}
}

// TestReportNotResentAfterH2StreamReset: a play report whose HTTP/2 stream
// the peer resets (PROTOCOL_ERROR) after reading the whole report is not
// posted again by the transport: the partner holds one copy, and the post
// fails in doubt (the copy may have been taken), for the caller to retry
// labelled. Two transports:
//   - the client's own (golang.org/x/net/http2): it re-sends through
//     GetBody only on REFUSED_STREAM and beyond a GOAWAY, so here the
//     refusal guards against a version that would re-send after a
//     PROTOCOL_ERROR reset; the reset is counted unsafe (countH2Error);
//   - the caller's (Config.HTTPClient), net/http's HTTP/2 as bundled: it
//     does re-send after a PROTOCOL_ERROR reset from the peer
//     (http2canRetryError, golang/go#47635), and the caller would see only
//     the second copy's 200 — two copies, none in doubt — unless getBody
//     refuses the rewind. This case fails with the refusal removed.
func TestReportNotResentAfterH2StreamReset(t *testing.T) {
	for _, own := range []bool{true, false} {
		name := map[bool]string{true: "own transport", false: "caller's net/http transport"}[own]
		t.Run(name, func(t *testing.T) {
			s := newH2ResetServer(t, firstProtocolError)
			roots := s.srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
			c := rawClient(t, s.srv.URL, func(cfg *Config) {
				cfg.RootCAs = roots
				cfg.RequestTimeout = 5 * time.Second
				if !own {
					tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
					t.Cleanup(tr.CloseIdleConnections)
					cfg.HTTPClient = &http.Client{Transport: tr, Timeout: 5 * time.Second}
				}
			})
			// A held token: the posts are the only requests.
			far := time.Now().Add(time.Hour)
			c.main.cur.Store(&token{hdr: []string{"tok1"}, renewAt: far, expires: far})

			res, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
			s.mu.Lock()
			seen := s.seen
			s.mu.Unlock()
			if n := s.copies(); n != 1 || seen != 1 {
				t.Errorf("the partner saw %d posts and took %d copies of the report, want 1 and 1 (the transport re-sent it)", seen, n)
			}
			if err == nil {
				t.Fatalf("the post succeeded (%+v): the stream reset after the whole report was written must leave it in doubt", res)
			}
			var e *Error
			if !errors.As(err, &e) || e.Kind != KindTransient || e.Doubt != schemas.DoubtConnectionLost {
				t.Fatalf("err = %v (doubt %q), want a transient error in doubt (%s)", err, Doubt(err), schemas.DoubtConnectionLost)
			}
			if own {
				// The transport reported the reset (countH2Error): getBody
				// would refuse a re-send of any post in flight with it.
				if n := c.h2Unsafe.Load(); n != 1 {
					t.Errorf("unsafe HTTP/2 errors counted %d, want 1 (the transport's CountError is not wired)", n)
				}
			}
			// The connection stays usable: the next post is answered.
			if _, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 2}); err != nil {
				t.Fatalf("next post: %v", err)
			}
			if n := s.copies(); n != 2 {
				t.Errorf("%d copies after the second post, want 2", n)
			}
		})
	}
}

// TestReportResentBeyondGoAway: a play report whose HTTP/2 stream the
// server did not process — beyond a graceful GOAWAY, or refused — after the
// whole report was written is re-sent by the transport and answered: one
// copy at the partner, no error, no doubt. Before getBody told these from a
// PROTOCOL_ERROR reset, each was a failed post in doubt (TestEdge's
// keep-alive 7 requests over HTTP/2 stalled on them).
func TestReportResentBeyondGoAway(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first int
	}{{"goaway", firstGoAway}, {"refused_stream", firstRefused}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newH2ResetServer(t, tc.first)
			roots := s.srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
			c := rawClient(t, s.srv.URL, func(cfg *Config) { cfg.RootCAs = roots; cfg.RequestTimeout = 5 * time.Second })
			far := time.Now().Add(time.Hour)
			c.main.cur.Store(&token{hdr: []string{"tok1"}, renewAt: far, expires: far})
			if _, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1}); err != nil {
				t.Fatalf("the post failed (%v, doubt %q): a stream the server did not process must be re-sent", err, Doubt(err))
			}
			s.mu.Lock()
			seen, copies := s.seen, len(s.got)
			s.mu.Unlock()
			if seen != 2 || copies != 1 {
				t.Errorf("the server saw %d posts and took %d copies, want 2 and 1", seen, copies)
			}
		})
	}
}

// TestReportGetBodyRule: the post's GetBody rewinds the body while no try
// has written the whole request (HTTP/1.1's re-send after nothing was
// written to a stale keep-alive connection, HTTP/2's before its stream
// started); once one has, only while no unsafe HTTP/2 error was counted
// since the post began, and never with the caller's own transport.
func TestReportGetBodyRule(t *testing.T) {
	var unsafe atomic.Uint64
	unsafe.Store(5)
	for _, tc := range []struct {
		name      string
		own       bool
		wrote     bool
		unsafeErr bool
		refused   bool
	}{
		{name: "not written", own: true},
		{name: "not written, caller's transport"},
		{name: "not written, unsafe error", own: true, unsafeErr: true},
		{name: "written, stream not processed", own: true, wrote: true},
		{name: "written, unsafe error", own: true, wrote: true, unsafeErr: true, refused: true},
		{name: "written, caller's transport", wrote: true, refused: true},
	} {
		pt := &postTrace{}
		if tc.own {
			pt.unsafe, pt.unsafe0 = &unsafe, unsafe.Load()
		}
		pt.wrote.Store(tc.wrote)
		if tc.unsafeErr {
			unsafe.Add(1)
		}
		rc, err := pt.getBody([]byte(`{"a":1}`))()
		if tc.refused {
			if !errors.Is(err, errResendRefused) || !pt.refused.Load() {
				t.Errorf("%s: %v, refused %v; want refused", tc.name, err, pt.refused.Load())
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v, want the body rewound", tc.name, err)
			continue
		}
		if b, _ := io.ReadAll(rc); string(b) != `{"a":1}` || pt.refused.Load() {
			t.Errorf("%s: rewound body %q, refused %v", tc.name, b, pt.refused.Load())
		}
	}
}

// TestCountH2Error: a stream reset by the server with any code but
// REFUSED_STREAM is unsafe; connection-level errors are not.
func TestCountH2Error(t *testing.T) {
	c := rawClient(t, "http://127.0.0.1:1", nil)
	c.countH2Error(h2RefusedStream)
	if n := c.h2Unsafe.Load(); n != 0 {
		t.Fatalf("a refused stream counted unsafe (%d)", n)
	}
	for _, e := range []string{"recv_goaway_PROTOCOL_ERROR", "read_frame_eof", "read_frame_too_large"} {
		c.countH2Error(e)
	}
	if n := c.h2Unsafe.Load(); n != 0 {
		t.Fatalf("connection-level errors counted unsafe (%d)", n)
	}
	for _, e := range []string{"recv_rststream_PROTOCOL_ERROR", "recv_rststream_CANCEL", "recv_rststream_ERR_UNKNOWN_99"} {
		c.countH2Error(e)
	}
	if n := c.h2Unsafe.Load(); n != 3 {
		t.Fatalf("unsafe errors counted %d, want 3", n)
	}
}
