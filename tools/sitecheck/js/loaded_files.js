/* normcore book, site check: everything the page has fetched so far. Returns
 * [{url, bytes}, ...], the document first, bytes decoded.
 */
() => [performance.getEntriesByType('navigation')[0]]
    .concat(performance.getEntriesByType('resource'))
    .map(e => ({url: e.name, bytes: e.decodedBodySize}))
