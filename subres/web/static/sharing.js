// Who holds the machine's console and display: the sessions API, read before and while connected.

const POLL_MS = 3000;

export class Presence {
  constructor({ url, headers, onChange }) {
    this.url = url;
    this.headers = headers;
    this.onChange = onChange;
    this.items = [];
    this.consoles = [];
    this.timer = null;
  }

  // The live sessions, or null when they cannot be read (no permission, an older server).
  async read() {
    try {
      const response = await fetch(this.url, { headers: this.headers, cache: 'no-store' });
      if (!response.ok) return null;
      const list = await response.json();
      this.items = list.items || [];
      this.consoles = list.consoles || [];
    } catch {
      return null;
    }
    this.onChange(this.items);
    return this.items;
  }

  follow() {
    if (this.timer === null) this.timer = setInterval(() => this.read(), POLL_MS);
  }
}

// Sessions of `subresource`, and of one console (`unit`, its name) when the machine has several.
function of(items, subresource, unit = '') {
  return (items || []).filter((i) => i.subresource === subresource && (i.unit || '') === unit);
}

export function holder(items, subresource, unit = '') {
  const mode = subresource === 'vnc' ? 'viewer' : 'writer';
  return of(items, subresource, unit).find((i) => i.mode === mode) || null;
}

// In the order they joined (then by name): the list's own order is each replica's.
export function observers(items, subresource, unit = '') {
  return of(items, subresource, unit)
    .filter((i) => i.mode === 'observer')
    .sort((a, b) => a.since.localeCompare(b.since) || a.user.localeCompare(b.user));
}

export function since(item) {
  return new Date(item.since).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

// One line for the banner: who holds it, who watches, whether it is recorded.
export function summary(items, subresource, unit = '') {
  const held = holder(items, subresource, unit);
  const acting = subresource === 'vnc' ? 'viewing' : 'writing';
  const watching = observers(items, subresource, unit).map((i) => i.user);
  const parts = [held ? `${held.user} ${acting} since ${since(held)}` : `nobody ${acting}`];
  if (watching.length) parts.push(`watched by ${watching.join(', ')}`);
  if (of(items, subresource, unit).some((i) => i.recorded)) parts.push('recorded');
  return parts.join(' · ');
}

// Ask, in `element`, whether to take over from `held` or to watch; resolves with the mode.
export function choose(element, held, { watch }) {
  return new Promise((resolve) => {
    const box = document.createElement('div');
    box.className = 'chooser';
    const text = document.createElement('span');
    text.textContent = `In use by ${held.user} since ${since(held)} — `;
    box.append(text);
    for (const [label, mode] of [['Take over', 'writer'], [watch, 'observer']]) {
      const button = document.createElement('button');
      button.textContent = label;
      button.dataset.mode = mode;
      button.addEventListener('click', () => {
        box.remove();
        resolve(mode);
      });
      box.append(button);
    }
    element.append(box);
  });
}
