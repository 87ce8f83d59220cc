// Command kubepeer drives subres's streaming subresources with client-go's own
// port-forward and exec clients, so tests exercise our server against the
// exact wire protocols (SPDY, and SPDY tunnelled over WebSocket) that kubectl
// speaks, without needing pods: the target is any URL we give it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/klog/v2"
)

const usage = `usage: kubepeer COMMAND [flags]

Commands:
  portforward --kubeconfig F --url URL [--transport spdy|websocket] [--address A] LOCAL:REMOTE...
      Listen on local ports and forward each connection to URL. Prints "ready"
      and then a JSON list of {"local","remote"} ports on stdout. Stops cleanly
      on SIGTERM, SIGINT or EOF on stdin.
  exec --kubeconfig F --url URL [--transport spdy|websocket] [--tty] [--stdin=false]
      Stream stdin/stdout/stderr to URL. Exits with the remote exit code, or 1
      with the error on stderr.

URL may be absolute or a path resolved against the kubeconfig's server.
Run "kubepeer COMMAND --help" for the flags of a command.
`

// errUsage marks mistakes in the command line, which exit with status 2.
var errUsage = errors.New("usage error")

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "portforward":
		err = portForward(args[1:])
	case "exec":
		err = execute(args[1:])
	case "help", "-h", "-help", "--help":
		fmt.Fprint(os.Stdout, usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "kubepeer: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	var exitErr interface{ ExitStatus() int }
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "kubepeer %s: %v\n", args[0], err)
		return 2
	case errors.As(err, &exitErr) && exitErr.ExitStatus() > 0:
		// The remote command ran and failed: hand its status to our caller.
		fmt.Fprintf(os.Stderr, "kubepeer %s: %v\n", args[0], err)
		return exitErr.ExitStatus()
	default:
		fmt.Fprintf(os.Stderr, "kubepeer %s: %v\n", args[0], err)
		return 1
	}
}

// common holds the flags every command shares.
type common struct {
	kubeconfig string
	rawURL     string
	transport  string
	verbosity  int
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig with the server and credentials (required)")
	fs.StringVar(&c.rawURL, "url", "", "URL of the subresource (required)")
	fs.StringVar(&c.transport, "transport", "websocket", "spdy, or websocket (kubectl's default since 1.31)")
	fs.IntVar(&c.verbosity, "v", 0, "client-go log verbosity on stderr")
}

// setup validates the shared flags and returns the client config and target URL.
func (c *common) setup() (*rest.Config, *url.URL, error) {
	if c.kubeconfig == "" || c.rawURL == "" {
		return nil, nil, fmt.Errorf("%w: --kubeconfig and --url are required", errUsage)
	}
	if c.transport != "spdy" && c.transport != "websocket" {
		return nil, nil, fmt.Errorf("%w: --transport must be spdy or websocket, not %q", errUsage, c.transport)
	}
	// client-go logs through klog; expose its verbosity to debug the server side.
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	if err := klogFlags.Set("v", strconv.Itoa(c.verbosity)); err != nil {
		return nil, nil, err
	}
	config, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	target, err := url.Parse(c.rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --url: %v", errUsage, err)
	}
	if !target.IsAbs() {
		server, err := url.Parse(config.Host)
		if err != nil {
			return nil, nil, fmt.Errorf("kubeconfig server: %w", err)
		}
		target = server.ResolveReference(target)
	}
	return config, target, nil
}

// signalContext is cancelled on SIGTERM or SIGINT, and also on stdin EOF when
// watchStdin is set, so a parent process can stop us just by closing a pipe.
func signalContext(watchStdin bool) (context.Context, context.CancelFunc) {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	if watchStdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	}
	return ctx, cancel
}

func portForward(args []string) error {
	fs := flag.NewFlagSet("kubepeer portforward", flag.ContinueOnError)
	var c common
	c.register(fs)
	address := fs.String("address", "127.0.0.1", "comma-separated local addresses to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	config, target, err := c.setup()
	if err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: give at least one LOCAL:REMOTE port pair", errUsage)
	}

	var dialer httpstream.Dialer
	if c.transport == "spdy" {
		roundTripper, upgrader, err := spdy.RoundTripperFor(config)
		if err != nil {
			return err
		}
		// kubectl port-forward POSTs the upgrade request; so do we.
		dialer = spdy.NewDialer(upgrader, &http.Client{Transport: roundTripper}, http.MethodPost, target)
	} else {
		dialer, err = portforward.NewSPDYOverWebsocketDialer(target, config)
		if err != nil {
			return err
		}
	}

	ctx, cancel := signalContext(true)
	defer cancel()
	ready := make(chan struct{})
	// The forwarder's chatter goes to stderr: stdout carries only our protocol.
	forwarder, err := portforward.NewOnAddressesWithContext(ctx, dialer, strings.Split(*address, ","), fs.Args(), ready, os.Stderr, os.Stderr)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}

	announced := make(chan error, 1)
	go func() {
		select {
		case <-ready:
			announced <- announce(forwarder)
		case <-ctx.Done():
			announced <- nil
		}
	}()
	if err := forwarder.ForwardPorts(); err != nil {
		return err
	}
	cancel()
	return <-announced
}

// forwardedPort is the JSON shape of one forwarded port on stdout.
type forwardedPort struct {
	Local  uint16 `json:"local"`
	Remote uint16 `json:"remote"`
}

func announce(forwarder *portforward.PortForwarder) error {
	ports, err := forwarder.GetPorts()
	if err != nil {
		return err
	}
	out := make([]forwardedPort, 0, len(ports))
	for _, p := range ports {
		out = append(out, forwardedPort{Local: p.Local, Remote: p.Remote})
	}
	line, err := json.Marshal(out)
	if err != nil {
		return err
	}
	// One write, so a reader never sees "ready" without the ports.
	_, err = fmt.Fprintf(os.Stdout, "ready\n%s\n", line)
	return err
}

func execute(args []string) (err error) {
	fs := flag.NewFlagSet("kubepeer exec", flag.ContinueOnError)
	var c common
	c.register(fs)
	tty := fs.Bool("tty", false, "ask for a terminal; stderr is then merged into stdout by the server")
	stdin := fs.Bool("stdin", true, "send our stdin to the remote side")
	if err := fs.Parse(args); err != nil {
		return err
	}
	config, target, err := c.setup()
	if err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: unexpected arguments %q (put the command in --url)", errUsage, fs.Args())
	}

	var executor remotecommand.Executor
	if c.transport == "spdy" {
		executor, err = remotecommand.NewSPDYExecutor(config, http.MethodPost, target)
	} else {
		// A WebSocket handshake must be a GET (RFC 6455 section 4.1).
		executor, err = remotecommand.NewWebSocketExecutor(config, http.MethodGet, target.String())
	}
	if err != nil {
		return err
	}

	options := remotecommand.StreamOptions{Stdout: os.Stdout, Stderr: os.Stderr, Tty: *tty}
	if *stdin {
		options.Stdin = os.Stdin
	}
	if *tty {
		// With a TTY there is no separate stderr stream, as with kubectl exec -t.
		options.Stderr = nil
	}
	// Stdin EOF is data here (the remote sees it), so only signals stop us.
	ctx, cancel := signalContext(false)
	defer cancel()
	// client-go v0.37 panics with a nil handler when a SPDY server agrees to
	// a protocol it does not know; report that as a failure of the server
	// under test rather than crash with a status that looks like ours.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("client-go panicked, did the server negotiate an unknown protocol? %v", p)
		}
	}()
	return executor.StreamWithContext(ctx, options)
}
