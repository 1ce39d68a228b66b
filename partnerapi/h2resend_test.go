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
	h2ProtocolError                                      = 0x1
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
// play report post is read to its end (END_STREAM) and then reset with
// RST_STREAM PROTOCOL_ERROR — the answer on which net/http's HTTP/2
// transport re-sends a request whose body it can rewind (GetBody;
// http2canRetryError, golang/go#47635). Later posts are answered 200 with
// the API's success body. Every complete body is one copy at the partner.
type h2ResetServer struct {
	srv *httptest.Server
	mu  sync.Mutex
	got [][]byte
}

func newH2ResetServer(t *testing.T) *h2ResetServer {
	t.Helper()
	s := &h2ResetServer{}
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
		s.got = append(s.got, body)
		n := len(s.got)
		s.mu.Unlock()
		if n == 1 {
			// The whole report is here; the stream is reset all the same.
			write(h2RSTStream, 0, f.stream, []byte{0, 0, 0, h2ProtocolError})
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
// labelled. Before, net/http re-sent it through GetBody and the caller saw
// only the second copy's 200: two copies, none in doubt.
func TestReportNotResentAfterH2StreamReset(t *testing.T) {
	s := newH2ResetServer(t)
	roots := s.srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	c := rawClient(t, s.srv.URL, func(cfg *Config) { cfg.RootCAs = roots; cfg.RequestTimeout = 5 * time.Second })
	// A held token: the posts are the only requests.
	far := time.Now().Add(time.Hour)
	c.main.cur.Store(&token{hdr: []string{"tok1"}, renewAt: far, expires: far})

	res, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
	if n := s.copies(); n != 1 {
		t.Errorf("%d copies of the report reached the partner, want 1 (the transport re-sent it)", n)
	}
	if err == nil {
		t.Fatalf("the post succeeded (%+v): the stream reset after the whole report was written must leave it in doubt", res)
	}
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindTransient || e.Doubt != schemas.DoubtConnectionLost {
		t.Fatalf("err = %v (doubt %q), want a transient error in doubt (%s)", err, Doubt(err), schemas.DoubtConnectionLost)
	}
	// The connection stays usable: the next post is answered.
	if _, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 2}); err != nil {
		t.Fatalf("next post: %v", err)
	}
	if n := s.copies(); n != 2 {
		t.Errorf("%d copies after the second post, want 2", n)
	}
}

// TestReportGetBodyRule: the post's GetBody rewinds the body while no try
// has written the whole request (HTTP/1.1's re-send after nothing was
// written to a stale keep-alive connection, HTTP/2's before its stream
// started), and refuses once one has.
func TestReportGetBodyRule(t *testing.T) {
	pt := &postTrace{}
	get := pt.getBody([]byte(`{"a":1}`))
	rc, err := get()
	if err != nil {
		t.Fatalf("before the request was written: %v", err)
	}
	if b, _ := io.ReadAll(rc); string(b) != `{"a":1}` || pt.refused.Load() {
		t.Fatalf("rewound body %q, refused %v", b, pt.refused.Load())
	}
	pt.wrote.Store(true)
	if _, err := get(); !errors.Is(err, errResendRefused) || !pt.refused.Load() {
		t.Fatalf("after the request was written: %v, refused %v", err, pt.refused.Load())
	}
}
