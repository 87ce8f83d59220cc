// Why a connection was refused, in the words the CLI uses, and whether trying again can help.
//
// A browser tells a page nothing of a refused WebSocket upgrade (no status, no body), so
// the page asks again with a dry run: a plain GET of the same subresource with
// `?dryRun=All`. Through `subres web`'s relay (the demo's page too) the answer is the very
// refusal the relay got for the upgrade, a backend's included. The server itself answers
// with the first of its checks that fails (who you are, whether you may, whether the
// machine exists and runs) or 200 when they all pass, and then only the dial can have
// failed. (Servers before dry runs answer that an upgrade was needed, which they say only
// once every check passed.) A 401 is final: a page without the key, or credentials the
// server does not take, gets nowhere by asking again.

const UPGRADE_NEEDED = /needs a WebSocket upgrade/;
const DIAL_FAILED = 'the server could not connect to the machine (is its backend up?)';

export async function explain(url, headers) {
  let response, status;
  try {
    const query = url.includes('?') ? '&' : '?';
    response = await fetch(`${url}${query}dryRun=All`, { headers, cache: 'no-store' });
    status = await response.json();
  } catch {
    return { text: '', final: false };
  }
  return { text: words(response, status), final: response.status === 401 };
}

function words(response, status) {
  if (response.ok) return DIAL_FAILED;
  if (!status || status.kind !== 'Status') return '';
  if (status.code === 400 && UPGRADE_NEEDED.test(status.message || '')) return DIAL_FAILED;
  if (status.code === 401 && (!status.message || status.message === 'Unauthorized')) {
    return 'error: You must be logged in to the server (Unauthorized)';
  }
  // No reason: no server answered, and the relay says why as the CLI does.
  if (!status.reason) return `error: ${status.message}`;
  return `Error from server (${status.reason}): ${status.message}`;
}
