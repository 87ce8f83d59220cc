// Command spdypeer is a SPDY/3.1 peer built on moby/spdystream, the library
// client-go and the kubelet use, for interoperability tests of subres's codec.
//
// It speaks over an inherited socket, the file descriptor given as its second
// argument, and never dials or listens.
//
//	spdypeer server FD   accept streams; reply with "reply-to: <streamtype>",
//	                     echo each stream's data back, half-close after the peer does
//	spdypeer client FD   ping, open a "streamtype: data" stream, send a message,
//	                     half-close, print the echo on stdout, then GOAWAY and exit
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"

	"github.com/moby/spdystream"
)

func main() {
	if len(os.Args) != 3 {
		fail(fmt.Errorf("usage: spdypeer server|client FD"))
	}
	fd, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fail(err)
	}
	sock, err := net.FileConn(os.NewFile(uintptr(fd), "peer"))
	if err != nil {
		fail(err)
	}
	switch os.Args[1] {
	case "server":
		serve(sock)
	case "client":
		dial(sock)
	default:
		fail(fmt.Errorf("unknown mode %q", os.Args[1]))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "spdypeer:", err)
	os.Exit(1)
}

func serve(sock net.Conn) {
	conn, err := spdystream.NewConnection(sock, true)
	if err != nil {
		fail(err)
	}
	go conn.Serve(echo)
	<-conn.CloseChan()
}

func echo(stream *spdystream.Stream) {
	reply := http.Header{"reply-to": {stream.Headers().Get("streamtype")}}
	if err := stream.SendReply(reply, false); err != nil {
		return
	}
	go func() {
		_, _ = io.Copy(stream, stream)
		_ = stream.Close()
	}()
}

func dial(sock net.Conn) {
	conn, err := spdystream.NewConnection(sock, false)
	if err != nil {
		fail(err)
	}
	go conn.Serve(spdystream.NoOpStreamHandler)
	if _, err := conn.Ping(); err != nil {
		fail(err)
	}
	stream, err := conn.CreateStream(http.Header{"streamtype": {"data"}, "port": {"80"}}, nil, false)
	if err != nil {
		fail(err)
	}
	if err := stream.Wait(); err != nil {
		fail(err)
	}
	if _, err := stream.Write([]byte("hello from go")); err != nil {
		fail(err)
	}
	if err := stream.Close(); err != nil {
		fail(err)
	}
	echoed, err := io.ReadAll(stream)
	if err != nil {
		fail(err)
	}
	fmt.Printf("%s\n", echoed)
	if err := conn.Close(); err != nil {
		fail(err)
	}
}
