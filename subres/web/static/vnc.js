// The VNC tab: noVNC's RFB client on a raw binary WebSocket, connected when first shown,
// interactive or view-only (vnc-observe) when someone else is viewing.
import RFB from './vendor/novnc/core/rfb.js';
import { choose, holder } from './sharing.js';

const SUBPROTOCOLS = ['binary'];

export class VncView {
  constructor(element, { url, observeUrl, auth, onStatus, presence, why }) {
    this.element = element;
    this.why = why;
    this.urls = { writer: url, observer: observeUrl };
    this.protocols = [...SUBPROTOCOLS, ...auth];
    this.onStatus = onStatus;
    this.presence = presence;
    this.rfb = null;
    this.mode = null;
    this.final = false;
  }

  async show() {
    if (this.mode === null) {
      this.mode = 'choosing';
      const held = holder(await this.presence.read(), 'vnc');
      this.mode = held ? await choose(this.element, held, { watch: 'View only' }) : 'writer';
    }
    if (this.mode === 'choosing' || this.final) return;
    if (this.rfb === null) this.connect();
    this.rfb.focus();
  }

  connect() {
    this.onStatus('connecting', 'connecting');
    this.failure = '';
    const rfb = new RFB(this.element, this.urls[this.mode], { wsProtocols: this.protocols });
    rfb.viewOnly = this.mode === 'observer';
    rfb.scaleViewport = true;
    const what = this.mode === 'observer' ? 'display (view-only)' : 'display';
    let opened = false;
    rfb.addEventListener('connect', () => {
      opened = true;
      this.onStatus('connected', `${what} connected`);
    });
    rfb.addEventListener('desktopname', (event) => {
      if (event.detail.name) this.onStatus('connected', `${what}: ${event.detail.name}`);
    });
    rfb.addEventListener('credentialsrequired', () => {
      const password = prompt('VNC password');
      if (password === null) rfb.disconnect();
      else rfb.sendCredentials({ password });
    });
    rfb.addEventListener('securityfailure', (event) => {
      this.failure = event.detail.reason || 'authentication failed';
    });
    rfb.addEventListener('disconnect', async (event) => {
      const refused = opened
        ? { text: '', final: false }
        : await this.why(this.mode === 'observer' ? 'vnc-observe' : 'vnc');
      const reason = this.failure || refused.text
        || (event.detail.clean ? 'closed' : 'connection lost');
      this.rfb = null;
      if (refused.final) {
        this.final = true; // refused for good (401): nothing connects again
        this.onStatus('disconnected', `display: ${reason}`);
        return;
      }
      this.onStatus('disconnected', `display: ${reason}; click to reconnect`);
      this.element.addEventListener('click', () => this.show(), { once: true });
    });
    this.rfb = rfb;
  }
}
