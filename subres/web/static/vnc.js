// The VNC tab: noVNC's RFB client on a raw binary WebSocket, connected when first shown.
import RFB from './vendor/novnc/core/rfb.js';

const SUBPROTOCOLS = ['binary'];

export class VncView {
  constructor(element, { url, auth, onStatus }) {
    this.element = element;
    this.url = url;
    this.protocols = [...SUBPROTOCOLS, ...auth];
    this.onStatus = onStatus;
    this.rfb = null;
  }

  show() {
    if (this.rfb === null) this.connect();
    this.rfb.focus();
  }

  connect() {
    this.onStatus('connecting', 'connecting');
    this.failure = '';
    const rfb = new RFB(this.element, this.url, { wsProtocols: this.protocols });
    rfb.scaleViewport = true;
    rfb.addEventListener('connect', () => this.onStatus('connected', 'display connected'));
    rfb.addEventListener('desktopname', (event) => {
      if (event.detail.name) this.onStatus('connected', `display: ${event.detail.name}`);
    });
    rfb.addEventListener('credentialsrequired', () => {
      const password = prompt('VNC password');
      if (password === null) rfb.disconnect();
      else rfb.sendCredentials({ password });
    });
    rfb.addEventListener('securityfailure', (event) => {
      this.failure = event.detail.reason || 'authentication failed';
    });
    rfb.addEventListener('disconnect', (event) => {
      const reason = this.failure || (event.detail.clean ? 'closed' : 'connection lost');
      this.onStatus('disconnected', `display: ${reason}; click to reconnect`);
      this.rfb = null;
      this.element.addEventListener('click', () => this.show(), { once: true });
    });
    this.rfb = rfb;
  }
}
