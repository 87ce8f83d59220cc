// The display player: a recorded VNC display (subres/protocol/displayrec.py) on a canvas, with
// seeking. Blocks are indexed from their heads; a seek draws the last key block before the
// moment and what follows it; markers (who attached, left, took over) are listed and seekable.
const MAGIC = 'SUBRES-DISPLAY/1\n';
const HEAD = 16;
const FRAME = 1, RECT = 2, MARK = 3, END = 4;

export class DisplayPlayer {
  static async open(element, buffer, { onStatus = () => {} } = {}) {
    const player = new DisplayPlayer(element, buffer, onStatus);
    await player.scan();
    player.build();
    const first = player.blocks.find((block) => block.key);
    await player.seek(first ? first.time : 0);
    return player;
  }

  constructor(element, buffer, onStatus) {
    this.element = element;
    this.bytes = new Uint8Array(buffer);
    this.view = new DataView(buffer);
    this.onStatus = onStatus;
    this.blocks = [];
    this.marks = [];
    this.duration = 0;
    this.time = 0;
    this.playing = false;
    this.image = null;
    this.generation = 0;
    this.header = this.readHeader();
  }

  readHeader() {
    const start = new TextDecoder().decode(this.bytes.subarray(0, MAGIC.length));
    if (start !== MAGIC) throw new Error('not a display recording');
    const end = this.bytes.indexOf(10, MAGIC.length);
    this.first = end + 1;
    return JSON.parse(new TextDecoder().decode(this.bytes.subarray(MAGIC.length, end)));
  }

  // Every whole block's place, key flag and time; then the markers and the end, decoded once.
  async scan() {
    let offset = this.first;
    while (offset + HEAD <= this.bytes.length) {
      const magic = this.bytes[offset] === 0x53 && this.bytes[offset + 1] === 0x44; // "SD"
      const length = this.view.getUint32(offset + 8);
      if (!magic || offset + HEAD + length > this.bytes.length) break; // a torn tail
      this.blocks.push({
        offset: offset + HEAD,
        length,
        key: (this.bytes[offset + 2] & 1) === 1,
        time: this.view.getUint32(offset + 4),
      });
      offset += HEAD + length;
    }
    for (const block of this.blocks) {
      for (const record of await this.records(block)) {
        this.duration = Math.max(this.duration, record.time);
        if (record.kind === MARK) this.marks.push(record);
      }
    }
  }

  async records(block) {
    const packed = this.bytes.subarray(block.offset, block.offset + block.length);
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream('deflate'));
    const data = new Uint8Array(await new Response(stream).arrayBuffer());
    const view = new DataView(data.buffer);
    const out = [];
    for (let pos = 0; pos < data.length;) {
      const kind = data[pos];
      const time = view.getUint32(pos + 1);
      if (kind === FRAME) {
        const width = view.getUint16(pos + 5), height = view.getUint16(pos + 7);
        const rgb = data.subarray(pos + 9, pos + 9 + width * height * 3);
        // A frame's rows are stored XORed with the row above: undone in place.
        for (let i = width * 3; i < rgb.length; i++) rgb[i] ^= rgb[i - width * 3];
        out.push({ kind, time, x: 0, y: 0, width, height, rgb });
        pos += 9 + rgb.length;
      } else if (kind === RECT) {
        const [x, y] = [view.getUint16(pos + 5), view.getUint16(pos + 7)];
        const [width, height] = [view.getUint16(pos + 9), view.getUint16(pos + 11)];
        const rgb = data.subarray(pos + 13, pos + 13 + width * height * 3);
        out.push({ kind, time, x, y, width, height, rgb });
        pos += 13 + rgb.length;
      } else if (kind === MARK) {
        const length = view.getUint16(pos + 5);
        const text = new TextDecoder().decode(data.subarray(pos + 7, pos + 7 + length));
        out.push({ kind, time, text });
        pos += 7 + length;
      } else if (kind === END) {
        out.push({ kind, time });
        pos += 5;
      } else {
        throw new Error(`unknown record type ${kind}`);
      }
    }
    return out;
  }

  build() {
    this.canvas = document.createElement('canvas');
    this.canvas.className = 'display';
    this.context = this.canvas.getContext('2d');
    const controls = document.createElement('div');
    controls.className = 'controls';
    this.button = document.createElement('button');
    this.button.textContent = 'Play';
    this.button.addEventListener('click', () => (this.playing ? this.pause() : this.play()));
    this.slider = document.createElement('input');
    Object.assign(this.slider, { type: 'range', min: 0, max: this.duration, step: 1, value: 0 });
    this.slider.addEventListener('input', () => this.seek(Number(this.slider.value)));
    this.clock = document.createElement('span');
    this.clock.className = 'clock';
    controls.append(this.button, this.slider, this.clock);
    const list = document.createElement('ol');
    list.className = 'marks';
    for (const mark of this.marks) {
      const item = document.createElement('li');
      const link = document.createElement('a');
      link.href = '#';
      link.textContent = `${clock(mark.time)} ${mark.text}`;
      link.addEventListener('click', (event) => { event.preventDefault(); this.seek(mark.time); });
      item.append(link);
      list.append(item);
    }
    this.element.replaceChildren(this.canvas, controls, list);
  }

  // Draw the display as it was at `time` (ms): from the last key block at or before it.
  async seek(time) {
    const generation = ++this.generation;
    this.pause();
    this.time = Math.max(0, Math.min(time, this.duration));
    let start = 0;
    this.blocks.forEach((block, index) => { if (block.key && block.time <= this.time) start = index; });
    const ready = [];
    let index = start;
    for (; index < this.blocks.length && this.blocks[index].time <= this.time; index++) {
      ready.push(...(await this.records(this.blocks[index])));
      if (generation !== this.generation) return; // a newer seek won
    }
    this.image = null;
    this.pending = [];
    for (const record of ready) {
      if (record.time <= this.time) this.apply(record);
      else this.pending.push(record);
    }
    this.next = index;
    this.show();
  }

  apply(record) {
    if (record.kind === FRAME) {
      this.canvas.width = record.width;
      this.canvas.height = record.height;
      this.image = this.context.createImageData(record.width, record.height);
    }
    if ((record.kind !== FRAME && record.kind !== RECT) || this.image === null) return;
    const { data, width } = this.image;
    for (let line = 0; line < record.height; line++) {
      let source = line * record.width * 3;
      let target = ((record.y + line) * width + record.x) * 4;
      for (let column = 0; column < record.width; column++) {
        data[target] = record.rgb[source];
        data[target + 1] = record.rgb[source + 1];
        data[target + 2] = record.rgb[source + 2];
        data[target + 3] = 255;
        source += 3;
        target += 4;
      }
    }
  }

  show() {
    if (this.image !== null) this.context.putImageData(this.image, 0, 0);
    this.slider.value = String(Math.round(this.time));
    this.clock.textContent = `${clock(this.time)} / ${clock(this.duration)}`;
    this.element.dataset.time = String(Math.round(this.time));
    this.onStatus(this.playing ? 'connected' : 'idle', this.playing ? 'playing' : 'paused');
  }

  play() {
    if (this.time >= this.duration) return this.seek(0).then(() => this.play());
    this.playing = true;
    this.button.textContent = 'Pause';
    let last = performance.now();
    const generation = this.generation;
    const step = async (now) => {
      if (!this.playing || generation !== this.generation) return;
      this.time = Math.min(this.duration, this.time + (now - last));
      last = now;
      await this.advance();
      if (this.time >= this.duration) this.pause();
      this.show();
      if (this.playing) requestAnimationFrame(step);
    };
    requestAnimationFrame(step);
  }

  // Apply what happened between the last drawn moment and `this.time`.
  async advance() {
    while (this.next < this.blocks.length && this.blocks[this.next].time <= this.time) {
      this.pending.push(...(await this.records(this.blocks[this.next])));
      this.next += 1;
    }
    while (this.pending.length && this.pending[0].time <= this.time) this.apply(this.pending.shift());
  }

  pause() {
    this.playing = false;
    if (this.button) this.button.textContent = 'Play';
  }
}

function clock(ms) {
  const seconds = Math.floor(ms / 1000);
  return `${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, '0')}`;
}
