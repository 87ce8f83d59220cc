#!/usr/bin/env bash
# A tiny real Linux VM for subres to serve: Debian's kernel and a busybox
# initramfs under QEMU, its two serial consoles (the kernel and a shell on the
# first, a getty on the second), VNC display and USB redirection slot on unix
# sockets and a web server in the guest forwarded to 127.0.0.1. See README.md
# beside this file.
#
#   run-vm.sh prepare                  install QEMU and busybox, fetch the kernel
#   run-vm.sh start STATE_DIR [PORT]   boot in the background (PORT: host port of the guest's :80, default 8080)
#   run-vm.sh stop STATE_DIR           stop the VM whose pidfile is in STATE_DIR
#   run-vm.sh run STATE_DIR [PORT]     boot in the foreground (a container's main process)
#
# Environment: SUBRES_VM_CACHE (where the kernel is kept, default
# ~/.cache/subres/qemu-vm), SUBRES_VM_ACCEL (kvm or tcg; default kvm when
# /dev/kvm is usable, else tcg), SUBRES_VM_NAME (the guest's hostname, vm1),
# SUBRES_VM_FORWARD_ADDRESS (where the guest's :80 is forwarded, default
# 127.0.0.1; 0.0.0.0 in a pod, whose address the Machine names).
set -euo pipefail

PACKAGES=(qemu-system-x86 busybox-static xz-utils)
CACHE=${SUBRES_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/subres/qemu-vm}
NAME=${SUBRES_VM_NAME:-vm1}
FORWARD_ADDRESS=${SUBRES_VM_FORWARD_ADDRESS:-127.0.0.1}
# Guest drivers, loaded from the initramfs: the display (QEMU's std VGA, with
# the frame buffer console on it) and the network card (QEMU's pc default).
DISPLAY_MODULE=bochs
NIC_MODULE=e1000

die() {
	echo "run-vm.sh: $*" >&2
	exit 1
}

usage() {
	sed -n 's/^#   //p' "$0" >&2
	exit 2
}

# Debian's packages, installed only when a command they ship is missing.
install_packages() {
	if command -v qemu-system-x86_64 xz >/dev/null && dpkg -s busybox-static >/dev/null 2>&1; then
		return
	fi
	[[ $(id -u) == 0 ]] || die "needs ${PACKAGES[*]}: run as root, or: sudo apt-get install ${PACKAGES[*]}"
	echo "run-vm.sh: installing ${PACKAGES[*]}" >&2
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
}

# The name of the kernel package that linux-image-amd64 points at, e.g. linux-image-6.1.0-57-amd64.
kernel_package() {
	apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n 1
}

# The kernel and the guest's drivers from the kernel .deb, extracted into the
# cache: nothing is installed, nothing goes to /boot.
fetch_kernel() {
	local package tmp
	package=$(kernel_package || true)
	# Offline (an image with no apt, or no lists) a prepared kernel is all there is.
	if [[ -z $package && -f $CACHE/current/vmlinux ]]; then
		return
	fi
	if [[ -z $package ]]; then
		[[ $(id -u) == 0 ]] || die "apt knows no linux-image-amd64: run apt-get update as root"
		apt-get update -q
		package=$(kernel_package)
		[[ -n $package ]] || die "apt knows no linux-image-amd64"
	fi
	if [[ ! -f $CACHE/$package/vmlinux || ! -f $CACHE/$package/modules/net ]]; then
		echo "run-vm.sh: fetching $package into $CACHE" >&2
		mkdir -p "$CACHE"
		tmp=$(mktemp -d "$CACHE/.fetch.XXXXXX")
		# Lists older than the archive name a kernel it no longer has: refresh them once.
		if ! (cd "$tmp" && apt-get download -q "$package"); then
			[[ $(id -u) == 0 ]] || die "apt-get download $package failed; apt-get update as root may help"
			apt-get update -q
			package=$(kernel_package)
			(cd "$tmp" && apt-get download -q "$package") || die "apt-get download $package failed"
		fi
		dpkg-deb --fsys-tarfile "$tmp/${package}"_*.deb | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*' \
			'./lib/modules/*/kernel/drivers/gpu/drm/*' './lib/modules/*/kernel/drivers/net/ethernet/*'
		mkdir -p "$tmp/out/modules"
		unpack_kernel "$tmp"/boot/vmlinuz-* "$tmp/out/vmlinux"
		pick_modules "$tmp"/lib/modules/* "$tmp/out/modules" display "$DISPLAY_MODULE"
		pick_modules "$tmp"/lib/modules/* "$tmp/out/modules" net "$NIC_MODULE"
		rm -rf "${CACHE:?}/$package"
		mv "$tmp/out" "$CACHE/$package"
		rm -rf "$tmp"
	fi
	ln -sfn "$package" "$CACHE/current"
}

# Copy module NAME and what it needs from the module tree TREE to OUT, and
# write their load order (dependencies first) to OUT/LIST. busybox's depmod
# writes modules.dep, whose lines list a module's dependencies last-needed first.
pick_modules() {
	local tree=$1 out=$2 list=$3 name=$4 line deps i
	[[ -f $tree/modules.dep ]] || busybox depmod -b "${tree%/lib/modules/*}" "${tree##*/}"
	line=$(grep -m 1 "/$name\.ko:" "$tree/modules.dep") || die "no $name.ko in the kernel package"
	read -ra deps <<<"${line#*:}"
	: >"$out/$list"
	for ((i = ${#deps[@]} - 1; i >= 0; i--)); do
		cp "$tree/${deps[i]}" "$out/"
		basename "${deps[i]}" >>"$out/$list"
	done
	cp "$tree/${line%%:*}" "$out/"
	echo "$name.ko" >>"$out/$list"
}

# The kernel as an uncompressed ELF, which QEMU boots through its PVH entry
# point: under TCG that is 20 s faster than the bzImage unpacking itself. The
# bzImage header says where the compressed payload starts (Linux's x86 boot
# protocol: setup_sects at 0x1f1, payload_offset at 0x248); Debian compresses it with xz.
# A kernel that does not unpack so is booted as it is.
unpack_kernel() {
	local bzimage=$1 out=$2 setup_sects payload_offset
	setup_sects=$(od -An -tu1 -j $((0x1f1)) -N1 "$bzimage")
	payload_offset=$(od -An -tu4 -j $((0x248)) -N4 "$bzimage")
	tail -c +$(((setup_sects + 1) * 512 + payload_offset + 1)) "$bzimage" >"$out.xz"
	if xz -dc --single-stream "$out.xz" >"$out" 2>/dev/null && [[ $(od -An -tx1 -N4 "$out") == " 7f 45 4c 46" ]]; then
		rm -f "$out.xz"
		return
	fi
	rm -f "$out.xz"
	echo "run-vm.sh: $bzimage is not an xz bzImage, booting it compressed" >&2
	cp "$bzimage" "$out"
}

# The guest's /init: mounts, loopback and network, a web page, a banner on the
# VGA console with a shell on tty1, a getty on ttyS1 (the second serial port) and a
# shell on ttyS0 that come back when they exit.
write_init() {
	cat >"$1" <<EOF
#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /sbin /usr/bin /usr/sbin /tmp /root
/bin/busybox --install -s
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
hostname $NAME
export HOME=/root PS1='$NAME# ' PATH=/sbin:/usr/sbin:/bin:/usr/bin
ip link set lo up
# The display driver puts a frame buffer console on the VGA card for VNC to show.
for m in \$(cat /lib/modules/display); do insmod /lib/modules/\$m; done
mkdir -p /www
echo "<h1>hello from $NAME</h1>" >/www/index.html
httpd -p 80 -h /www
# QEMU user-mode networking: the guest is 10.0.2.15, the host side 10.0.2.2.
# The driver takes seconds to probe under TCG: do not hold the shells up for it.
(
	for m in \$(cat /lib/modules/net); do insmod /lib/modules/\$m; done
	ip link set eth0 up &&
		ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2
) &

banner() {
	printf '\033[2J\033[H\033[1;37;44m'
	printf '  %-60s\n' "subres qemu-vm example: $NAME" "" \\
		"Linux \$(uname -r), busybox initramfs" \\
		"serial console: ttyS0    this screen: tty1 (VGA)" \\
		"web page: guest port 80"
	printf '\033[0m\n'
}
(while :; do banner >/dev/tty1; setsid -c sh -i </dev/tty1 >/dev/tty1 2>&1; done) &
# The second serial port: busybox's getty, which prints /etc/issue (\\l: the tty) and,
# asking no login name (-n), starts a shell.
mkdir -p /etc
echo "$NAME serial1: getty on \\l" >/etc/issue
(while :; do getty -n -l /bin/sh 115200 ttyS1 vt100; done) &
while :; do
	echo "$NAME: shell on ttyS0"
	setsid -c sh -i </dev/ttyS0 >/dev/ttyS0 2>&1
done
EOF
	chmod 755 "$1"
}

# The initramfs: busybox, /init and the drivers, as a gzipped newc cpio.
build_initramfs() {
	local out=$1 root
	root=$(mktemp -d)
	mkdir -p "$root/bin" "$root/lib"
	cp /bin/busybox "$root/bin/busybox"
	cp -r "$CACHE/current/modules" "$root/lib/modules"
	write_init "$root/init"
	(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$out.tmp"
	mv "$out.tmp" "$out"
	rm -rf "$root"
}

# KVM when it runs a Debian kernel here, else TCG. A /dev/kvm that opens may
# still not boot one (nested or paravirtual hosts), so boot the kernel once
# with KVM to its "no root" panic and keep the verdict per host kernel.
accel() {
	case ${SUBRES_VM_ACCEL:-} in
	kvm | tcg) echo "$SUBRES_VM_ACCEL" ;;
	"")
		if [[ ! -r /dev/kvm || ! -w /dev/kvm ]]; then
			echo tcg
			return
		fi
		local verdict log
		verdict=$CACHE/accel-$(uname -r)
		if [[ ! -f $verdict ]]; then
			log=$(mktemp)
			timeout 10 qemu-system-x86_64 -accel kvm -m 128M -nodefaults -no-reboot -display none \
				-kernel "$CACHE/current/vmlinux" -append "console=ttyS0 panic=-1" \
				-serial "file:$log" </dev/null >/dev/null 2>&1 || true
			if grep -q 'Kernel panic' "$log"; then echo kvm >"$verdict"; else echo tcg >"$verdict"; fi
			rm -f "$log"
		fi
		cat "$verdict"
		;;
	*) die "SUBRES_VM_ACCEL is kvm or tcg" ;;
	esac
}

# The VM's command line, booting from STATE_DIR's sockets and initramfs; the
# caller adds how it runs (in the background or not).
prepare_vm() {
	local dir=$1 port=$2
	[[ $port =~ ^[0-9]+$ ]] || die "port must be a number: $port"
	install_packages
	fetch_kernel
	mkdir -p "$dir"
	rm -f "$dir/serial.sock" "$dir/serial1.sock" "$dir/vnc.sock" "$dir/usbredir0.sock"
	build_initramfs "$dir/initramfs.gz"
	HOW=$(accel)
	# The USB redirection slot is QEMU's usb-redir device on an xHCI controller: a
	# usbredir client (usbredirect, through subres) plugs a USB device of its own into
	# the guest there.
	QEMU=(
		qemu-system-x86_64
		-accel "$HOW" -m 256M -smp 1 -nodefaults -no-reboot
		-kernel "$CACHE/current/vmlinux" -initrd "$dir/initramfs.gz"
		-append "console=tty1 console=ttyS0 video=1024x768 quiet panic=1"
		-chardev "socket,id=s0,path=$dir/serial.sock,server=on,wait=off" -serial chardev:s0
		-chardev "socket,id=s1,path=$dir/serial1.sock,server=on,wait=off" -serial chardev:s1
		-vga std -display none -vnc "unix:$dir/vnc.sock"
		-device qemu-xhci,id=xhci
		-chardev "socket,id=usbredir0,path=$dir/usbredir0.sock,server=on,wait=off"
		-device usb-redir,chardev=usbredir0,id=redir0
		-nic "user,model=e1000,restrict=on,hostfwd=tcp:$FORWARD_ADDRESS:$port-:80"
		-name "$NAME"
	)
}

start() {
	local dir=$1 port=${2:-8080} pid
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [[ -f $dir/qemu.pid ]] && kill -0 "$(cat "$dir/qemu.pid")" 2>/dev/null; then
		die "a VM is already running from $dir (pid $(cat "$dir/qemu.pid"))"
	fi
	rm -f "$dir/qemu.pid"
	prepare_vm "$dir" "$port"
	# -daemonize returns once the sockets listen.
	"${QEMU[@]}" -pidfile "$dir/qemu.pid" -daemonize
	pid=$(cat "$dir/qemu.pid")
	echo "run-vm.sh: $NAME running as pid $pid ($HOW)"
	echo "  serial console: unix://$dir/serial.sock (serial0: the kernel and a shell)"
	echo "  serial1:        unix://$dir/serial1.sock (a getty)"
	echo "  vnc display:    unix://$dir/vnc.sock"
	echo "  usb slot:       unix://$dir/usbredir0.sock"
	echo "  guest :80 at:   $FORWARD_ADDRESS:$port"
}

# In the foreground, QEMU in this process's place: a container's main process, which
# ends when the VM does (or on SIGTERM).
run() {
	local dir=$1 port=${2:-8080}
	prepare_vm "$dir" "$port"
	echo "run-vm.sh: $NAME running ($HOW): unix://$dir/serial.sock, unix://$dir/vnc.sock, :80 at $FORWARD_ADDRESS:$port"
	exec "${QEMU[@]}"
}

stop() {
	local dir=$1 pid i
	[[ -f $dir/qemu.pid ]] || die "no $dir/qemu.pid"
	pid=$(cat "$dir/qemu.pid")
	# QEMU exits cleanly on SIGTERM; the guest keeps nothing.
	if kill -TERM "$pid" 2>/dev/null; then
		for ((i = 0; i < 100; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "run-vm.sh: pid $pid ignored SIGTERM for 10 s, killing it" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$dir/qemu.pid" "$dir/serial.sock" "$dir/serial1.sock" "$dir/vnc.sock" "$dir/usbredir0.sock" \
		"$dir/initramfs.gz"
	echo "run-vm.sh: stopped pid $pid"
}

case ${1:-} in
prepare) [[ $# == 1 ]] || usage; install_packages; fetch_kernel; echo "run-vm.sh: ready ($(accel))" ;;
start) [[ $# == 2 || $# == 3 ]] || usage; start "$2" "${3:-}" ;;
stop) [[ $# == 2 ]] || usage; stop "$2" ;;
run) [[ $# == 2 || $# == 3 ]] || usage; run "$2" "${3:-}" ;;
*) usage ;;
esac
