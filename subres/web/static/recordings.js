// The recordings tab: a machine's recorded console and display sessions, each played on the
// replay page.

export class RecordingsView {
  constructor(element, { url, headers, machine, onStatus }) {
    this.element = element;
    this.url = url;
    this.headers = headers;
    this.machine = machine;
    this.onStatus = onStatus;
  }

  async show() {
    this.onStatus('connecting', 'reading recordings');
    let items;
    try {
      const response = await fetch(this.url, { headers: this.headers, cache: 'no-store' });
      if (!response.ok) {
        const status = await response.json().catch(() => ({}));
        this.onStatus('disconnected', `recordings: ${status.message || response.statusText}`);
        return;
      }
      items = (await response.json()).items || [];
    } catch (error) {
      this.onStatus('disconnected', `recordings: ${error.message}`);
      return;
    }
    this.onStatus('connected', `${items.length} recording${items.length === 1 ? '' : 's'}`);
    this.element.replaceChildren(items.length ? this.table(items) : this.none());
  }

  none() {
    const text = document.createElement('p');
    text.textContent = 'No recorded sessions of this machine. Its console sessions are recorded '
      + 'when the server has a recordings directory (consoles.recordings) and the machine opts in '
      + '(annotation subres.dev/record-console: "true").';
    return text;
  }

  table(items) {
    const table = document.createElement('table');
    table.className = 'recordings';
    const head = table.createTHead().insertRow();
    for (const title of ['Started', 'Of', 'Size', 'Title', '']) {
      const cell = document.createElement('th');
      cell.textContent = title;
      head.append(cell);
    }
    const body = table.createTBody();
    for (const item of items) {
      const row = body.insertRow();
      row.insertCell().textContent = new Date(item.started).toLocaleString();
      row.insertCell().textContent = item.subresource === 'vnc' ? 'display' : 'console';
      row.insertCell().textContent = `${Math.ceil(item.size / 1024)} KiB`;
      row.insertCell().textContent = item.title;
      const link = document.createElement('a');
      const query = new URLSearchParams({ machine: this.machine, recording: item.name });
      link.href = `replay.html?${query}`;
      link.textContent = 'Play';
      link.dataset.recording = item.name;
      row.insertCell().append(link);
    }
    return table;
  }
}
