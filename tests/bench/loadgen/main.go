// Command loadgen is the throughput benchmark's data source, sink and client.
//
// It is Go so that the ends of a measured path cost little CPU next to the
// relay between them (the bench prints every side's CPU to show it).
//
//	loadgen backend -bytes N
//	    Listens on 127.0.0.1 and prints "sink PORT" and "source PORT". A sink
//	    connection reads N bytes, answers one byte "k", then drains to EOF; a
//	    source connection writes N bytes in 64 KiB writes, half-closes, then
//	    drains to EOF. Stops on EOF on stdin.
//	loadgen tcp -dir up|down -addr HOST:PORT -bytes N [-ca FILE]
//	loadgen ws -dir up|down -url URL -bytes N [-ca FILE] [-token T] [-subprotocol P] [-channel]
//	    One transfer of N bytes in 64 KiB writes (or messages): "up" sends them
//	    and waits for the sink's "k", "down" reads them from a source. With
//	    -ca the connection is TLS trusting that CA; -channel adds and strips
//	    kubelet's port-forward channel byte. Prints one JSON line: seconds
//	    (after the connection is set up) and the client's own CPU seconds.
//	loadgen sessions -url URL -n N -c C [-ca FILE] [-token T] [-subprotocol P]
//	    Opens and closes N WebSocket sessions, C at a time: TLS handshake,
//	    upgrade, close handshake, hang-up. Worker w replaces "{w}" in the URL
//	    with its number, so no session takes over another's console. Prints one
//	    JSON line: seconds, sessions, failed, the first error, client CPU.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

const chunk = 64 * 1024

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadgen backend|tcp|ws|sessions [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "backend":
		err = backend(os.Args[2:])
	case "tcp", "ws":
		err = client(os.Args[1], os.Args[2:])
	case "sessions":
		err = sessions(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadgen %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// --- backend --------------------------------------------------------------

func backend(args []string) error {
	fs := flag.NewFlagSet("backend", flag.ContinueOnError)
	total := fs.Int64("bytes", 0, "bytes per transfer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	source, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("sink %d\nsource %d\n", sink.Addr().(*net.TCPAddr).Port, source.Addr().(*net.TCPAddr).Port)
	go serve(sink, func(c *net.TCPConn) { sinkConn(c, *total) })
	go serve(source, func(c *net.TCPConn) { sourceConn(c, *total) })
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

func serve(l net.Listener, handle func(*net.TCPConn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c.(*net.TCPConn))
		}()
	}
}

func sinkConn(c *net.TCPConn, total int64) {
	buf := make([]byte, 256*1024)
	var got int64
	for got < total {
		n, err := c.Read(buf)
		got += int64(n)
		if err != nil {
			return
		}
	}
	if _, err := c.Write([]byte("k")); err != nil {
		return
	}
	_, _ = io.CopyBuffer(io.Discard, c, buf)
}

func sourceConn(c *net.TCPConn, total int64) {
	buf := make([]byte, chunk)
	for sent := int64(0); sent < total; {
		n := min(int64(len(buf)), total-sent)
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
		sent += n
	}
	_ = c.CloseWrite()
	_, _ = io.Copy(io.Discard, c)
}

// --- clients --------------------------------------------------------------

type options struct {
	dir, addr, url, ca, token, subprotocol string
	total                                  int64
	channel                                bool
	timeout                                time.Duration
}

func client(kind string, args []string) error {
	fs := flag.NewFlagSet(kind, flag.ContinueOnError)
	var o options
	fs.StringVar(&o.dir, "dir", "up", "up or down")
	fs.StringVar(&o.addr, "addr", "", "tcp: host:port")
	fs.StringVar(&o.url, "url", "", "ws: ws:// or wss:// URL")
	fs.StringVar(&o.ca, "ca", "", "use TLS, trusting this CA file")
	fs.StringVar(&o.token, "token", "", "ws: bearer token")
	fs.StringVar(&o.subprotocol, "subprotocol", "", "ws: subprotocol to offer")
	fs.BoolVar(&o.channel, "channel", false, "ws: kubelet port-forward channel framing (channel 0)")
	fs.Int64Var(&o.total, "bytes", 0, "bytes to transfer")
	fs.DurationVar(&o.timeout, "timeout", 120*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tlsConfig, err := tlsFor(o.ca)
	if err != nil {
		return err
	}
	var seconds float64
	if kind == "tcp" {
		seconds, err = tcpTransfer(o, tlsConfig)
	} else {
		seconds, err = wsTransfer(o, tlsConfig)
	}
	if err != nil {
		return err
	}
	fmt.Printf("{\"seconds\": %.6f, \"cpu\": %.4f, \"bytes\": %d}\n", seconds, cpuSeconds(), o.total)
	return nil
}

func tlsFor(ca string) (*tls.Config, error) {
	if ca == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", ca)
	}
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, nil
}

func tcpTransfer(o options, tlsConfig *tls.Config) (float64, error) {
	var c net.Conn
	var err error
	if tlsConfig != nil {
		c, err = tls.Dial("tcp", o.addr, tlsConfig)
	} else {
		c, err = net.Dial("tcp", o.addr)
	}
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(o.timeout))
	start := time.Now()
	if o.dir == "up" {
		buf := make([]byte, chunk)
		for sent := int64(0); sent < o.total; {
			n := min(int64(len(buf)), o.total-sent)
			if _, err := c.Write(buf[:n]); err != nil {
				return 0, err
			}
			sent += n
		}
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			return 0, fmt.Errorf("waiting for the sink's answer: %w", err)
		}
	} else {
		got, err := io.CopyBuffer(io.Discard, io.LimitReader(c, o.total), make([]byte, 256*1024))
		if err != nil {
			return 0, err
		}
		if got < o.total {
			return 0, fmt.Errorf("source ended after %d of %d bytes", got, o.total)
		}
	}
	return time.Since(start).Seconds(), nil
}

func wsTransfer(o options, tlsConfig *tls.Config) (float64, error) {
	dialer := websocket.Dialer{
		TLSClientConfig:   tlsConfig,
		HandshakeTimeout:  30 * time.Second,
		ReadBufferSize:    256 * 1024,
		WriteBufferSize:   chunk + 16,
		EnableCompression: false,
	}
	if o.subprotocol != "" {
		dialer.Subprotocols = []string{o.subprotocol}
	}
	header := http.Header{}
	if o.token != "" {
		header.Set("Authorization", "Bearer "+o.token)
	}
	conn, resp, err := dialer.Dial(o.url, header)
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(bufio.NewReader(resp.Body))
			return 0, fmt.Errorf("%w: %s %s", err, resp.Status, body)
		}
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(o.timeout))
	_ = conn.SetWriteDeadline(time.Now().Add(o.timeout))
	conn.SetReadLimit(-1)
	start := time.Now()
	// The reader also answers the server's pings while an upload runs.
	want := o.total
	if o.dir == "up" {
		want = 1
	}
	done := make(chan error, 1)
	go func() { done <- wsRead(conn, want, o.channel) }()
	if o.dir == "up" {
		prefix := 0
		if o.channel {
			prefix = 1
		}
		buf := make([]byte, prefix+chunk)
		for sent := int64(0); sent < o.total; {
			n := min(int64(chunk), o.total-sent)
			if err := conn.WriteMessage(websocket.BinaryMessage, buf[:int64(prefix)+n]); err != nil {
				return 0, err
			}
			sent += n
		}
	}
	if err := <-done; err != nil {
		return 0, err
	}
	seconds := time.Since(start).Seconds()
	_ = conn.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	return seconds, nil
}

// wsRead reads until `want` payload bytes arrived. With channel framing each
// message starts with its channel; the first message of each channel names
// the port and is skipped, and text on the error channel (1) is a failure.
func wsRead(conn *websocket.Conn, want int64, channel bool) error {
	buf := make([]byte, 256*1024)
	seen := map[byte]bool{}
	var got int64
	for got < want {
		_, r, err := conn.NextReader()
		if err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", got, want, err)
		}
		if channel {
			var head [1]byte
			if _, err := io.ReadFull(r, head[:]); err != nil {
				if errors.Is(err, io.EOF) {
					continue
				}
				return err
			}
			if !seen[head[0]] {
				seen[head[0]] = true
				_, _ = io.Copy(io.Discard, r)
				continue
			}
			if head[0] != 0 {
				text, _ := io.ReadAll(r)
				return fmt.Errorf("channel %d: %s", head[0], text)
			}
		}
		for {
			n, err := r.Read(buf)
			got += int64(n)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// --- sessions -------------------------------------------------------------

func sessions(args []string) error {
	fs := flag.NewFlagSet("sessions", flag.ContinueOnError)
	url := fs.String("url", "", "wss:// URL; {w} becomes the worker's number")
	ca := fs.String("ca", "", "use TLS, trusting this CA file")
	token := fs.String("token", "", "bearer token")
	subprotocol := fs.String("subprotocol", "", "subprotocol to offer")
	total := fs.Int("n", 100, "sessions in all")
	workers := fs.Int("c", 1, "sessions at a time")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tlsConfig, err := tlsFor(*ca)
	if err != nil {
		return err
	}
	dialer := websocket.Dialer{TLSClientConfig: tlsConfig, HandshakeTimeout: 30 * time.Second}
	if *subprotocol != "" {
		dialer.Subprotocols = []string{*subprotocol}
	}
	header := http.Header{}
	if *token != "" {
		header.Set("Authorization", "Bearer "+*token)
	}
	jobs := make(chan struct{}, *total)
	for range *total {
		jobs <- struct{}{}
	}
	close(jobs)
	errs := make(chan error, *total)
	start := time.Now()
	done := make(chan struct{})
	for w := range *workers {
		target := strings.ReplaceAll(*url, "{w}", strconv.Itoa(w))
		go func() {
			for range jobs {
				errs <- openClose(&dialer, target, header)
			}
			done <- struct{}{}
		}()
	}
	for range *workers {
		<-done
	}
	seconds := time.Since(start).Seconds()
	close(errs)
	failed, first := 0, ""
	for err := range errs {
		if err != nil {
			if failed == 0 {
				first = err.Error()
			}
			failed++
		}
	}
	out, _ := json.Marshal(map[string]any{
		"seconds": seconds, "sessions": *total, "failed": failed, "first_error": first, "cpu": cpuSeconds(),
	})
	fmt.Println(string(out))
	return nil
}

// openClose is one whole session: dial (TLS, upgrade), then the close handshake.
func openClose(dialer *websocket.Dialer, url string, header http.Header) error {
	conn, resp, err := dialer.Dial(url, header)
	if err != nil {
		if resp != nil {
			return fmt.Errorf("%w: %s", err, resp.Status)
		}
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(30 * time.Second)
	_ = conn.SetReadDeadline(deadline)
	if err := conn.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), deadline); err != nil {
		return err
	}
	for {
		if _, _, err := conn.NextReader(); err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				return nil
			}
			return err
		}
	}
}
