// Why a connection was refused, in the words the CLI uses.
//
// A browser tells a page nothing of a refused WebSocket upgrade (no status, no body), so
// the page asks again with a dry run: a plain GET of the same subresource with
// `?dryRun=All`, which the server answers with the first of its checks that fails (who you
// are, whether you may, whether the machine exists and runs) or 200 when they all pass,
// and then only the dial can have failed. (Servers before dry runs answer that an upgrade
// was needed, which they say only once every check passed.)

const UPGRADE_NEEDED = /needs a WebSocket upgrade/;
const DIAL_FAILED = 'the server could not connect to the machine (is its backend up?)';

export async function explain(url, headers) {
  let response, status;
  try {
    const query = url.includes('?') ? '&' : '?';
    response = await fetch(`${url}${query}dryRun=All`, { headers, cache: 'no-store' });
    status = await response.json();
  } catch {
    return '';
  }
  if (response.ok) return DIAL_FAILED;
  if (!status || status.kind !== 'Status') return '';
  if (status.code === 400 && UPGRADE_NEEDED.test(status.message || '')) return DIAL_FAILED;
  if (status.code === 401 && (!status.message || status.message === 'Unauthorized')) {
    return 'error: You must be logged in to the server (Unauthorized)';
  }
  return `Error from server (${status.reason || response.statusText}): ${status.message}`;
}
